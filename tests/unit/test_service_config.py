"""grpc_retry._config: validation of the `grpc.service_config` JSON (gRFC A6) and the objects it yields."""

from __future__ import annotations

import dataclasses
import json
import re
from decimal import Decimal
from typing import Any

import pytest

from grpc_retry._config import (
    EMPTY_SERVICE_CONFIG,
    HedgingPolicy,
    MethodConfig,
    RetryPolicy,
    ServiceConfigError,
    parse_service_config,
)

RETRY = {
    "maxAttempts": 3,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
HEDGING = {"maxAttempts": 3, "hedgingDelay": "0.5s", "nonFatalStatusCodes": ["UNAVAILABLE"]}
NAME = [{"service": "pkg.Svc"}]


def dumps(doc: Any) -> str:
    """JSON text of doc; a Decimal becomes a JSON number written exactly as its text."""
    return re.sub(r'"@decimal:([^"]*)"', r"\1", json.dumps(doc, default=lambda d: f"@decimal:{d}"))


def errors_of(doc: Any, **kwargs: Any) -> list[str]:
    text = doc if isinstance(doc, str) else dumps(doc)
    with pytest.raises(ServiceConfigError) as info:
        parse_service_config(text, **kwargs)
    return info.value.errors


def method(**fields: Any) -> dict[str, Any]:
    return {"methodConfig": [{"name": NAME, **fields}]}


def retry(**fields: Any) -> dict[str, Any]:
    return method(retryPolicy={k: v for k, v in {**RETRY, **fields}.items() if v is not ...})


def hedging(**fields: Any) -> dict[str, Any]:
    return method(hedgingPolicy={k: v for k, v in {**HEDGING, **fields}.items() if v is not ...})


def throttling(**fields: Any) -> dict[str, Any]:
    return {
        "retryThrottling": {
            k: v for k, v in {"maxTokens": 10, "tokenRatio": 0.1, **fields}.items() if v is not ...
        }
    }


R = "methodConfig[0].retryPolicy"
H = "methodConfig[0].hedgingPolicy"
M = "methodConfig[0]"
T = "retryThrottling"

INVALID = [
    # root and structure
    ("[]", "<root>: must be an object"),
    ('"x"', "<root>: must be an object"),
    ({"methodConfig": {}}, "methodConfig: must be a list"),
    ({"methodConfig": [1]}, "methodConfig[0]: must be an object"),
    ({"methodConfig": [{"name": {}}]}, "methodConfig[0].name: must be a list"),
    ({"methodConfig": [{"name": ["svc"]}]}, "methodConfig[0].name[0]: must be an object"),
    ({"methodConfig": [{"name": [{"service": 1}]}]}, "methodConfig[0].name[0].service: must be a string"),
    (
        {"methodConfig": [{"name": [{"service": "s", "method": []}]}]},
        "methodConfig[0].name[0].method: must be a string",
    ),
    (
        {"methodConfig": [{"name": [{"method": "M"}]}]},
        "methodConfig[0].name[0]: method given without service",
    ),
    (
        {"methodConfig": [{"name": [{"service": "", "method": "M"}]}]},
        "methodConfig[0].name[0]: method given without service",
    ),
    (
        {"methodConfig": [{"name": [{"service": "s", "method": "M"}, {"service": "s", "method": "M"}]}]},
        "methodConfig[0].name[1]: duplicate name '/s/M'",
    ),
    (
        {"methodConfig": [{"name": [{"service": "s"}]}, {"name": [{"service": "s"}]}]},
        "methodConfig[1].name[0]: duplicate name '/s/'",
    ),
    (
        {"methodConfig": [{"name": [{}]}, {"name": [{"service": ""}]}]},
        "methodConfig[1].name[0]: duplicate default name",
    ),
    (
        method(retryPolicy=RETRY, hedgingPolicy=HEDGING),
        "methodConfig[0]: retryPolicy and hedgingPolicy are mutually exclusive",
    ),
    # retryPolicy
    (method(retryPolicy=[]), f"{R}: must be an object"),
    (retry(maxAttempts=...), f"{R}.maxAttempts: is required"),
    (retry(maxAttempts=None), f"{R}.maxAttempts: is required"),
    (retry(maxAttempts=1), f"{R}.maxAttempts: must be at least 2"),
    (retry(maxAttempts=0), f"{R}.maxAttempts: must be at least 2"),
    (retry(maxAttempts=-3), f"{R}.maxAttempts: must be at least 2"),
    (retry(maxAttempts="1"), f"{R}.maxAttempts: must be at least 2"),
    (retry(maxAttempts=True), f"{R}.maxAttempts: must be an integer or an integer string"),
    (retry(maxAttempts=Decimal("2.5")), f"{R}.maxAttempts: must be an integer or an integer string"),
    (retry(maxAttempts="three"), f"{R}.maxAttempts: must be an integer or an integer string"),
    (retry(maxAttempts=" 3"), f"{R}.maxAttempts: must be an integer or an integer string"),
    (retry(initialBackoff=...), f"{R}.initialBackoff: is required"),
    (retry(initialBackoff="0s"), f"{R}.initialBackoff: must be greater than 0"),
    (retry(initialBackoff="-1s"), f"{R}.initialBackoff: must be greater than 0"),
    (retry(initialBackoff=1), f"{R}.initialBackoff: must be a duration string such as \"1.5s\""),
    (retry(initialBackoff="1"), f"{R}.initialBackoff: invalid duration '1' (expected e.g. \"1.5s\")"),
    (retry(initialBackoff="1.5ms"), f"{R}.initialBackoff: invalid duration '1.5ms' (expected e.g. \"1.5s\")"),
    (retry(initialBackoff="abc"), f"{R}.initialBackoff: invalid duration 'abc' (expected e.g. \"1.5s\")"),
    (retry(maxBackoff=...), f"{R}.maxBackoff: is required"),
    (retry(maxBackoff="0.000s"), f"{R}.maxBackoff: must be greater than 0"),
    (retry(maxBackoff="1S"), f"{R}.maxBackoff: invalid duration '1S' (expected e.g. \"1.5s\")"),
    (retry(maxBackoff="315576000001s"), f"{R}.maxBackoff: duration '315576000001s' is out of range"),
    (retry(backoffMultiplier=...), f"{R}.backoffMultiplier: is required"),
    (retry(backoffMultiplier=0), f"{R}.backoffMultiplier: must be greater than 0"),
    (retry(backoffMultiplier=-1.5), f"{R}.backoffMultiplier: must be greater than 0"),
    (retry(backoffMultiplier=False), f"{R}.backoffMultiplier: must be a number or a numeric string"),
    (retry(backoffMultiplier=Decimal("1e400")), f"{R}.backoffMultiplier: is too large"),
    (retry(retryableStatusCodes=...), f"{R}.retryableStatusCodes: is required"),
    (retry(retryableStatusCodes=[]), f"{R}.retryableStatusCodes: must be non-empty"),
    (retry(retryableStatusCodes="UNAVAILABLE"), f"{R}.retryableStatusCodes: must be a list"),
    (retry(retryableStatusCodes=["OK"]), f"{R}.retryableStatusCodes[0]: OK cannot be retryable"),
    (retry(retryableStatusCodes=[0]), f"{R}.retryableStatusCodes[0]: OK cannot be retryable"),
    (
        retry(retryableStatusCodes=["unavailable"]),
        f"{R}.retryableStatusCodes[0]: unknown status code 'unavailable' (did you mean 'UNAVAILABLE'?)",
    ),
    (
        retry(retryableStatusCodes=["UNAVAILABLE", "NOPE"]),
        f"{R}.retryableStatusCodes[1]: unknown status code 'NOPE'",
    ),
    (retry(retryableStatusCodes=[17]), f"{R}.retryableStatusCodes[0]: unknown status code 17"),
    (retry(retryableStatusCodes=[-1]), f"{R}.retryableStatusCodes[0]: unknown status code -1"),
    (
        retry(retryableStatusCodes=[True]),
        f"{R}.retryableStatusCodes[0]: must be a status code name or number",
    ),
    (
        retry(retryableStatusCodes=[Decimal("14.0")]),
        f"{R}.retryableStatusCodes[0]: must be a status code name or number",
    ),
    # hedgingPolicy
    (method(hedgingPolicy="x"), f"{H}: must be an object"),
    (hedging(maxAttempts=...), f"{H}.maxAttempts: is required"),
    (hedging(maxAttempts=1), f"{H}.maxAttempts: must be at least 2"),
    (hedging(maxAttempts=False), f"{H}.maxAttempts: must be an integer or an integer string"),
    (hedging(hedgingDelay="-0.5s"), f"{H}.hedgingDelay: must not be negative"),
    (hedging(hedgingDelay=0), f"{H}.hedgingDelay: must be a duration string such as \"1.5s\""),
    (hedging(hedgingDelay="0.5"), f"{H}.hedgingDelay: invalid duration '0.5' (expected e.g. \"1.5s\")"),
    (hedging(nonFatalStatusCodes=["OK"]), f"{H}.nonFatalStatusCodes[0]: OK cannot be non-fatal"),
    (
        hedging(nonFatalStatusCodes=["Internal"]),
        f"{H}.nonFatalStatusCodes[0]: unknown status code 'Internal' (did you mean 'INTERNAL'?)",
    ),
    # other method fields
    (method(timeout="-1s"), f"{M}.timeout: must not be negative"),
    (method(timeout=5), f"{M}.timeout: must be a duration string such as \"1.5s\""),
    (method(timeout="5"), f"{M}.timeout: invalid duration '5' (expected e.g. \"1.5s\")"),
    (method(waitForReady="true"), f"{M}.waitForReady: must be a boolean"),
    (method(waitForReady=1), f"{M}.waitForReady: must be a boolean"),
    (method(maxRequestMessageBytes=-1), f"{M}.maxRequestMessageBytes: must be in [0, 4294967295]"),
    (method(maxRequestMessageBytes="-1"), f"{M}.maxRequestMessageBytes: must be in [0, 4294967295]"),
    (method(maxRequestMessageBytes=2**32), f"{M}.maxRequestMessageBytes: must be in [0, 4294967295]"),
    (method(maxRequestMessageBytes=Decimal("1.5")),
     f"{M}.maxRequestMessageBytes: must be an integer or an integer string"),
    (method(maxResponseMessageBytes="1k"), f"{M}.maxResponseMessageBytes: must be an integer or an integer string"),
    (method(maxResponseMessageBytes=[]), f"{M}.maxResponseMessageBytes: must be an integer or an integer string"),
    # retryThrottling
    ({"retryThrottling": 10}, f"{T}: must be an object"),
    (throttling(maxTokens=...), f"{T}.maxTokens: is required"),
    (throttling(maxTokens=0), f"{T}.maxTokens: must be greater than 0"),
    (throttling(maxTokens=-1), f"{T}.maxTokens: must be greater than 0"),
    (throttling(maxTokens=Decimal("1000.001")), f"{T}.maxTokens: must be at most 1000"),
    (throttling(maxTokens=1001), f"{T}.maxTokens: must be at most 1000"),
    (throttling(maxTokens=Decimal("0.0001")), f"{T}.maxTokens: must have at most 3 decimal places"),
    (throttling(maxTokens=True), f"{T}.maxTokens: must be a number or a numeric string"),
    (throttling(tokenRatio=...), f"{T}.tokenRatio: is required"),
    (throttling(tokenRatio=0), f"{T}.tokenRatio: must be greater than 0"),
    (throttling(tokenRatio=2**32), f"{T}.tokenRatio: must be at most 4294967295"),
    (throttling(tokenRatio=None), f"{T}.tokenRatio: is required"),
    # load balancing
    (
        {"loadBalancingPolicy": "grpclb"},
        "loadBalancingPolicy: unsupported policy 'grpclb' (supported: pick_first, round_robin)",
    ),
    ({"loadBalancingPolicy": 1}, "loadBalancingPolicy: must be a string"),
    ({"loadBalancingConfig": {"round_robin": {}}}, "loadBalancingConfig: must be a list"),
    (
        {"loadBalancingConfig": []},
        "loadBalancingConfig: no supported policy "
        "(supported: pick_first, round_robin, outlier_detection_experimental, ring_hash_experimental)",
    ),
    (
        {"loadBalancingConfig": [{"grpclb": {}}]},
        "loadBalancingConfig: no supported policy "
        "(supported: pick_first, round_robin, outlier_detection_experimental, ring_hash_experimental)",
    ),
    (
        {"loadBalancingConfig": [{"ROUND_ROBIN": {}}]},  # keys are case-sensitive here
        "loadBalancingConfig: no supported policy (found 'ROUND_ROBIN': did you mean 'round_robin'?)",
    ),
]


@pytest.mark.parametrize(("doc", "expected"), INVALID, ids=[e for _, e in INVALID])
def test_invalid_config_reports_path_and_reason(doc: Any, expected: str) -> None:
    errors = errors_of(doc)
    assert errors == [expected]


@pytest.mark.parametrize(
    "doc",
    [
        {"loadBalancingConfig": [{"round_robin": {}, "pick_first": {}}]},
        {"loadBalancingConfig": [{}]},
    ],
)
def test_lb_config_entry_must_have_one_key(doc: Any) -> None:
    assert errors_of(doc) == ["loadBalancingConfig[0]: must have exactly one key (the policy name)"]


def test_lb_config_takes_the_first_policy_it_implements_and_looks_no_further() -> None:
    # As gRPC: policies this client does not implement are skipped (their config unread), and what follows
    # the chosen one is not looked at.
    doc = {"loadBalancingConfig": [{"grpclb": 1}, {"xds_wrr_locality_experimental": {}}, {"round_robin": {}},
                                   "pick_first", {"a": 1, "b": 2}]}
    assert parse_service_config(dumps(doc)).lb_policy == "round_robin"
    assert errors_of({"loadBalancingConfig": [{"pick_first": 1}]}) == [
        "loadBalancingConfig[0].pick_first: must be an object"]


@pytest.mark.parametrize(
    "text", ["{", "{'a': 1}", "NaN", '{"retryThrottling": {"maxTokens": Infinity}}', " ", "[" * 100_000]
)
def test_invalid_json(text: str) -> None:
    errors = errors_of(text)
    assert len(errors) == 1 and errors[0].startswith("<root>: invalid JSON: ")


def test_every_error_is_reported_together() -> None:
    doc = {
        "methodConfig": [
            {
                "name": [{"method": "M"}],
                "retryPolicy": {
                    "maxAttempts": 1,
                    "initialBackoff": "1",
                    "backoffMultiplier": 0,
                    "retryableStatusCodes": ["OK"],
                },
            },
            {"name": [{}], "hedgingPolicy": {"maxAttempts": 2, "nonFatalStatusCodes": [0]}, "timeout": "-2s"},
        ],
        "retryThrottling": {"maxTokens": 2000, "tokenRatio": -1},
        "loadBalancingPolicy": "random",
    }
    expected = [
        "methodConfig[0].name[0]: method given without service",
        f"{R}.maxAttempts: must be at least 2",
        f"{R}.initialBackoff: invalid duration '1' (expected e.g. \"1.5s\")",
        f"{R}.maxBackoff: is required",
        f"{R}.backoffMultiplier: must be greater than 0",
        f"{R}.retryableStatusCodes[0]: OK cannot be retryable",
        "methodConfig[1].hedgingPolicy.nonFatalStatusCodes[0]: OK cannot be non-fatal",
        "methodConfig[1].timeout: must not be negative",
        "retryThrottling.maxTokens: must be at most 1000",
        "retryThrottling.tokenRatio: must be greater than 0",
        "loadBalancingPolicy: unsupported policy 'random' (supported: pick_first, round_robin)",
    ]
    with pytest.raises(ServiceConfigError) as info:
        parse_service_config(dumps(doc))
    assert info.value.errors == expected
    assert str(info.value) == "invalid service config: " + "; ".join(expected)
    assert isinstance(info.value, ValueError)


def test_error_is_exported_by_the_package() -> None:
    import grpc_retry

    assert grpc_retry.ServiceConfigError is ServiceConfigError


@pytest.mark.parametrize("text", [None, ""])
def test_no_config_is_the_empty_config(text: Any) -> None:
    config = parse_service_config(text)
    assert config is EMPTY_SERVICE_CONFIG
    assert config.method_config("/pkg.Svc/M") is None
    assert config.retry_throttling is None and config.lb_policy is None


def test_empty_object_and_unknown_fields() -> None:
    config = parse_service_config(
        dumps({"healthCheckConfig": {}, "methodConfig": [], "retryThrottling": None, "future": 1})
    )
    assert config == EMPTY_SERVICE_CONFIG.__class__(health_check_service="")
    config = parse_service_config(dumps(retry(perAttemptRecvTimeout="1s", future=[1])))
    assert config.method_config("/pkg.Svc/M") == MethodConfig(
        retry_policy=RetryPolicy(3, 0.1, 1.0, 2.0, frozenset({14}), 1.0)
    )


def test_full_method_config_values() -> None:
    doc = method(
        retryPolicy={**RETRY, "retryableStatusCodes": ["UNAVAILABLE", "ABORTED", 4, "ABORTED"]},
        timeout="2.5s",
        waitForReady=False,
        maxRequestMessageBytes="4194304",
        maxResponseMessageBytes=0,
    )
    config = parse_service_config(dumps(doc))
    assert config.method_config("/pkg.Svc/Any") == MethodConfig(
        retry_policy=RetryPolicy(
            max_attempts=3,
            initial_backoff=0.1,
            max_backoff=1.0,
            backoff_multiplier=2.0,
            retryable_status_codes=frozenset({14, 10, 4}),
        ),
        timeout=2.5,
        wait_for_ready=False,
        max_request_message_bytes=4194304,
        max_response_message_bytes=0,
    )


def test_hedging_values_and_default_delay() -> None:
    config = parse_service_config(dumps(hedging(hedgingDelay=..., nonFatalStatusCodes=["INTERNAL", 14])))
    assert config.method_config("/pkg.Svc/M") == MethodConfig(
        hedging_policy=HedgingPolicy(
            max_attempts=3, hedging_delay=0.0, non_fatal_status_codes=frozenset({13, 14})
        )
    )
    config = parse_service_config(dumps(hedging(hedgingDelay="0s")))
    assert config.method_config("/pkg.Svc/M").hedging_policy.hedging_delay == 0.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("attempts", "cap", "expected"),
    [(9, 5, 5), (5, 5, 5), (2, 5, 2), (9, 7, 7), ("100", 5, 5), (2**32 - 1, 5, 5), (4, 2, 2)],
)
def test_max_attempts_is_clamped_to_the_cap(attempts: Any, cap: int, expected: int) -> None:
    retry_config = parse_service_config(dumps(retry(maxAttempts=attempts)), max_attempts_cap=cap)
    hedging_config = parse_service_config(dumps(hedging(maxAttempts=attempts)), max_attempts_cap=cap)
    assert retry_config.method_config("/pkg.Svc/M").retry_policy.max_attempts == expected  # type: ignore[union-attr]
    assert hedging_config.method_config("/pkg.Svc/M").hedging_policy.max_attempts == expected  # type: ignore


def test_invalid_cap_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="max_attempts_cap"):
        parse_service_config("{}", max_attempts_cap=0)


def test_most_specific_method_config_wins() -> None:
    doc = {
        "methodConfig": [
            {"name": [{}], "timeout": "1s"},
            {"name": [{"service": "a.S"}, {"service": "b.S", "method": "Only"}], "timeout": "2s"},
            {"name": [{"service": "a.S", "method": "Exact"}], "timeout": "3s"},
        ]
    }
    config = parse_service_config(dumps(doc))

    def timeout(path: str) -> Any:
        found = config.method_config(path)
        return None if found is None else found.timeout

    assert timeout("/a.S/Exact") == 3.0
    assert timeout("/a.S/Other") == 2.0
    assert timeout("/b.S/Only") == 2.0
    assert timeout("/b.S/Other") == 1.0
    assert timeout("/c.S/Exact") == 1.0
    assert timeout("/a.S.Sub/Exact") == 1.0
    assert set(config.method_configs) == {"", "/a.S/", "/b.S/Only", "/a.S/Exact"}


def test_lookup_without_default_and_empty_name_lists() -> None:
    entries = [
        {"name": [{"service": "a.S", "method": "M", "extra": 1}], "waitForReady": True},
        {"timeout": "1s"},
        {"name": [], "timeout": "2s"},
    ]
    config = parse_service_config(dumps({"methodConfig": entries}))
    assert config.method_config("/a.S/M") == MethodConfig(wait_for_ready=True)
    assert config.method_config("/a.S/N") is None
    assert config.method_config("/b.S/M") is None
    assert dict(config.method_configs) == {"/a.S/M": MethodConfig(wait_for_ready=True)}
    # A null service, like an empty one, names the default config.
    config = parse_service_config(
        dumps({"methodConfig": [*entries, {"name": [{"service": None}], "timeout": "4s"}]})
    )
    assert config.method_config("/b.S/M") == MethodConfig(timeout=4.0)


def test_results_are_immutable_and_hashable() -> None:
    config = parse_service_config(dumps({**retry(), **throttling()}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lb_policy = "round_robin"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.method_configs["/x/"] = MethodConfig()  # type: ignore[index]
    policy = config.method_config("/pkg.Svc/M").retry_policy  # type: ignore[union-attr]
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_attempts = 9  # type: ignore[misc,union-attr]
    assert hash(config) == hash(parse_service_config(dumps({**retry(), **throttling()})))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0.1s", 0.1),
        ("1.5s", 1.5),
        ("3s", 3.0),
        ("1.000000001s", 1.000000001),
        ("0.000000001s", 1e-9),
        ("0.100s", 0.1),
        ("315576000000s", 315576000000.0),
        ("007s", 7.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    config = parse_service_config(dumps(retry(initialBackoff=text, maxBackoff=text)))
    policy = config.method_config("/pkg.Svc/M").retry_policy  # type: ignore[union-attr]
    assert policy is not None and policy.initial_backoff == seconds and policy.max_backoff == seconds


@pytest.mark.parametrize(
    "text",
    [
        "1.0000000001s",
        "+1s",
        " 1s",
        "1s ",
        "1e3s",
        "1.s",
        "s",
        "1_0s",
        "\u0661s",
        "1 s",
        "0x1s",
        "-s",
        "1.5",
        "",
        "1ss",
    ],
)
def test_malformed_durations(text: str) -> None:
    assert errors_of(method(timeout=text)) == [
        f'{M}.timeout: invalid duration {text!r} (expected e.g. "1.5s")'
    ]


@pytest.mark.parametrize(
    ("max_tokens", "ratio", "milli", "milli_ratio"),
    [
        ("10", "0.1", 10_000, 100),
        ("0.001", "0.001", 1, 1),
        ("999.999", "1.5", 999_999, 1_500),
        ("1000", "1000.000", 1_000_000, 1_000_000),
        ("1.500", "0.300", 1_500, 300),
        ("1e2", "2E-3", 100_000, 2),
        ("0.1", "4294967295", 100, 4_294_967_295_000),
    ],
)
def test_throttling_milli_tokens_are_exact(max_tokens: str, ratio: str, milli: int, milli_ratio: int) -> None:
    text = f'{{"retryThrottling": {{"maxTokens": {max_tokens}, "tokenRatio": {ratio}}}}}'
    throttle = parse_service_config(text).retry_throttling
    assert throttle is not None
    assert (throttle.max_milli_tokens, throttle.milli_token_ratio) == (milli, milli_ratio)
    assert (throttle.max_tokens, throttle.token_ratio) == (float(max_tokens), float(ratio))


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({}, None),
        ({"loadBalancingPolicy": "pick_first"}, "pick_first"),
        ({"loadBalancingPolicy": "ROUND_ROBIN"}, "round_robin"),
        ({"loadBalancingPolicy": "Pick_First"}, "pick_first"),
        ({"loadBalancingConfig": [{"round_robin": {}}]}, "round_robin"),
        (
            {
                "loadBalancingConfig": [
                    {"xds": {}},
                    {"weighted_round_robin": {}},
                    {"pick_first": {"shuffleAddressList": True}},
                    {"round_robin": {}},
                ]
            },
            "pick_first",
        ),
        ({"loadBalancingConfig": [{"round_robin": {}}], "loadBalancingPolicy": "pick_first"}, "round_robin"),
        ({"loadBalancingConfig": None, "loadBalancingPolicy": "round_robin"}, "round_robin"),
    ],
)
def test_lb_policy_selection(doc: dict[str, Any], expected: Any) -> None:
    assert parse_service_config(dumps(doc)).lb_policy == expected
