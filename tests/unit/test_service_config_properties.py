"""grpc_retry._config under hypothesis: a valid service config parses to the values it gives; gRPC's published
schema (third_party/service_config.proto) and the parser agree on what is valid; any input yields a config or a
ServiceConfigError."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_service_config import HEDGING, dumps, retry, throttling

from grpc_retry._config import (
    STATUS_CODE_NAMES,
    HedgingPolicy,
    MethodConfig,
    RetryPolicy,
    ServiceConfig,
    ServiceConfigError,
    parse_service_config,
)

CODES = st.integers(1, 16).flatmap(lambda c: st.sampled_from([c, STATUS_CODE_NAMES[c]]))
DURATIONS = st.tuples(st.integers(0, 1000), st.integers(0, 999_999_999)).filter(lambda d: d != (0, 0))


def duration_text(d: tuple[int, int]) -> str:
    return f"{d[0]}.{d[1]:09d}s"


def code_numbers(codes: list[Any]) -> frozenset[int]:
    return frozenset(c if isinstance(c, int) else STATUS_CODE_NAMES.index(c) for c in codes)


@st.composite
def valid_configs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A valid service config and, per method path, the values the parser must produce."""
    doc: dict[str, Any] = {"methodConfig": []}
    expected: dict[str, Any] = {}
    services = draw(
        st.lists(
            st.from_regex(r"[a-z]{1,8}(\.[A-Z][a-z]{0,6})?", fullmatch=True),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    for service in services:
        method_name = draw(st.none() | st.from_regex(r"[A-Z][a-zA-Z]{0,8}", fullmatch=True))
        name = {"service": service} if method_name is None else {"service": service, "method": method_name}
        attempts = draw(st.integers(2, 10))
        codes = draw(st.lists(CODES, min_size=1, max_size=5))
        if draw(st.booleans()):
            initial, maximum = draw(DURATIONS), draw(DURATIONS)
            multiplier = draw(st.floats(min_value=1e-3, max_value=1e3))
            policy = {
                "maxAttempts": attempts,
                "initialBackoff": duration_text(initial),
                "maxBackoff": duration_text(maximum),
                "backoffMultiplier": multiplier,
                "retryableStatusCodes": codes,
            }
            entry: dict[str, Any] = {"name": [name], "retryPolicy": policy}
            want = MethodConfig(
                retry_policy=RetryPolicy(
                    min(attempts, 5),
                    float(duration_text(initial)[:-1]),
                    float(duration_text(maximum)[:-1]),
                    multiplier,
                    code_numbers(codes),
                )
            )
        else:
            delay = draw(st.none() | DURATIONS)
            policy = {"maxAttempts": attempts, "nonFatalStatusCodes": codes}
            if delay is not None:
                policy["hedgingDelay"] = duration_text(delay)
            entry = {"name": [name], "hedgingPolicy": policy}
            want = MethodConfig(
                hedging_policy=HedgingPolicy(
                    min(attempts, 5),
                    0.0 if delay is None else float(duration_text(delay)[:-1]),
                    code_numbers(codes),
                )
            )
        doc["methodConfig"].append(entry)
        expected[f"/{service}/{method_name or 'AnyMethod'}"] = want
    milli, milli_ratio = draw(st.integers(1, 1_000_000)), draw(st.integers(1, 10**7))
    doc["retryThrottling"] = {
        "maxTokens": Decimal(milli).scaleb(-3),
        "tokenRatio": Decimal(milli_ratio).scaleb(-3),
    }
    expected["throttling"] = (milli, milli_ratio)
    return doc, expected


@given(valid_configs())
def test_valid_configs_round_trip(case: tuple[dict[str, Any], dict[str, Any]]) -> None:
    doc, expected = case
    config = parse_service_config(dumps(doc))
    throttle = config.retry_throttling
    assert throttle is not None
    assert (throttle.max_milli_tokens, throttle.milli_token_ratio) == expected.pop("throttling")
    assert throttle.max_tokens == throttle.max_milli_tokens / 1000
    for path, want in expected.items():
        assert config.method_config(path) == want


@pytest.fixture(scope="module")
def service_config_pb2(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The module generated from third_party/service_config.proto (built here if the build has not run)."""
    try:
        return importlib.import_module("grpc_retry._proto.service_config_pb2")
    except Exception:  # not built, or built by a newer protoc than the protobuf installed here (VersionError)
        pass
    protoc = pytest.importorskip("grpc_tools.protoc")
    import grpc_tools

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path_factory.mktemp("proto")
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    assert (
        protoc.main(
            [
                "protoc",
                f"-I{os.path.join(root, 'third_party')}",
                f"-I{include}",
                f"--python_out={out}",
                os.path.join(root, "third_party", "service_config.proto"),
            ]
        )
        == 0
    )
    spec = importlib.util.spec_from_file_location("_service_config_pb2", out / "service_config_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_schema_accepts_the_documented_example(service_config_pb2: Any) -> None:
    from google.protobuf import json_format

    doc = {
        **retry(),
        **throttling(),
        "loadBalancingConfig": [{"round_robin": {}}],
        "loadBalancingPolicy": "x",
    }
    doc["methodConfig"].append(
        {
            "name": [{}],
            "hedgingPolicy": HEDGING,
            "timeout": "1s",
            "waitForReady": True,
            "maxRequestMessageBytes": 10,
        }
    )
    message = json_format.Parse(dumps(doc), service_config_pb2.ServiceConfig())
    assert message.method_config[0].retry_policy.retryable_status_codes == [service_config_pb2.UNAVAILABLE]
    assert message.method_config[1].hedging_policy.hedging_delay.ToMilliseconds() == 500
    assert message.method_config[1].wait_for_ready.value is True
    assert message.load_balancing_config[0].WhichOneof("policy") == "round_robin"


@settings(max_examples=50)
@given(valid_configs())
def test_schema_agrees_with_the_parser(
    service_config_pb2: Any, case: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    from google.protobuf import json_format

    doc, _ = case
    message = json_format.Parse(dumps(doc), service_config_pb2.ServiceConfig())
    config = parse_service_config(dumps(doc), max_attempts_cap=1000)
    for entry in message.method_config:
        name = entry.name[0]
        parsed = config.method_config(f"/{name.service}/{name.method or 'AnyMethod'}")
        assert parsed is not None
        if entry.WhichOneof("retry_or_hedging_policy") == "retry_policy":
            policy = entry.retry_policy
            assert parsed.retry_policy is not None
            assert parsed.retry_policy.max_attempts == policy.max_attempts
            assert round(parsed.retry_policy.initial_backoff * 1e9) == policy.initial_backoff.ToNanoseconds()
            assert parsed.retry_policy.retryable_status_codes == frozenset(policy.retryable_status_codes)
        else:
            policy = entry.hedging_policy
            assert parsed.hedging_policy is not None
            assert parsed.hedging_policy.max_attempts == policy.max_attempts
            assert round(parsed.hedging_policy.hedging_delay * 1e9) == policy.hedging_delay.ToNanoseconds()
            assert parsed.hedging_policy.non_fatal_status_codes == frozenset(policy.non_fatal_status_codes)
    assert config.retry_throttling is not None
    assert config.retry_throttling.max_tokens == message.retry_throttling.max_tokens


KEYS = [
    "methodConfig",
    "name",
    "service",
    "method",
    "retryPolicy",
    "hedgingPolicy",
    "maxAttempts",
    "initialBackoff",
    "maxBackoff",
    "backoffMultiplier",
    "retryableStatusCodes",
    "hedgingDelay",
    "nonFatalStatusCodes",
    "timeout",
    "waitForReady",
    "maxRequestMessageBytes",
    "maxResponseMessageBytes",
    "retryThrottling",
    "maxTokens",
    "tokenRatio",
    "loadBalancingPolicy",
    "loadBalancingConfig",
    "round_robin",
    "pick_first",
]
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["UNAVAILABLE", "OK", "1s", "-1s", "0.1s", "round_robin", "PICK_FIRST", "", "3"])
    | st.text(max_size=5)
)
NEAR_SCHEMA = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), children, max_size=6)
    ),
    max_leaves=40,
)
ERROR = re.compile(
    r"(<root>|methodConfig|retryThrottling|loadBalancingPolicy|loadBalancingConfig).*: .+", re.DOTALL
)


@settings(max_examples=300)
@given(st.one_of(NEAR_SCHEMA, st.text(max_size=20), st.binary(max_size=20)))
def test_arbitrary_input_yields_a_config_or_service_config_errors(doc: Any) -> None:
    text = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
    try:
        config = parse_service_config(text)  # type: ignore[arg-type]
    except ServiceConfigError as exc:
        assert exc.errors, "an error without reasons"
        assert all(ERROR.fullmatch(error) for error in exc.errors), exc.errors
    else:
        assert isinstance(config, ServiceConfig)
