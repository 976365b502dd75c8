"""The service config and targets as gRPC takes them: what it accepts is accepted (numbers as strings, optional
fields, policies this client lacks), what it rightly rejects is rejected, any text ends in a config or a
ServiceConfigError, likely mistakes are warned about, and the published example configs all load."""

from __future__ import annotations

import json
import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import grpc_retry
from grpc_retry._backends.target import parse_target
from grpc_retry._config import ServiceConfigError, ServiceConfigWarning, parse_service_config
from grpc_retry._options import parse_options

NAME = [{"service": "pkg.Svc"}]


def method(**fields) -> str:
    return json.dumps({"methodConfig": [{"name": NAME, **fields}]})


def errors(text: str) -> list:
    with pytest.raises(ServiceConfigError) as info:
        parse_service_config(text)
    return info.value.errors


# -- never anything but ServiceConfigError -----------------------------------------------------------------------


@pytest.mark.parametrize("text, words", [
    ('{"a": 1e99999999999999999999}', "out of range"),
    ('{"a": 1' + "0" * 5000 + "}", "too long"),
    ('{"a": -1.5e-99999999}', "out of range"),
    ("[" * 100_000, "nested too deeply"),
    ('{"a": ' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
])
def test_hostile_numbers_and_nesting_end_in_a_clear_error(text, words):
    (error,) = errors(text)
    assert error.startswith("<root>: invalid JSON: ") and words in error
    assert "set_int_max_str_digits" not in error and "recursion" not in error and len(error) < 200


def test_long_values_are_echoed_short():
    (error,) = errors(method(timeout="x" * 10_000))
    assert "..." in error and len(error) < 160


def test_thousands_of_errors_make_a_short_message():
    doc = {"methodConfig": [{"name": [{"method": f"m{i}"}]} for i in range(5000)]}
    with pytest.raises(ServiceConfigError) as info:
        parse_service_config(json.dumps(doc))
    assert len(info.value.errors) == 5000
    assert str(info.value).endswith("; and 4980 more") and len(str(info.value)) < 2000


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["methodConfig", "name", "service", "retryPolicy", "hedgingPolicy", "maxAttempts",
                         "hedgingDelay", "tokenRatio", "maxTokens", "retryThrottling", "loadBalancingConfig",
                         "timeout", "round_robin", "x"]) | st.text(max_size=8), children, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), json_values.map(json.dumps)))
def test_any_text_gives_a_config_or_a_service_config_error_quickly(text):
    def took() -> float:
        started = time.perf_counter()
        try:
            parse_service_config(text)
        except ServiceConfigError:
            pass
        return time.perf_counter() - started

    # The quickest of three: a slow parse is slow each time, a pause of the shared machine's is not.
    assert min(took() for _ in range(3)) < 0.05


# -- accept what gRPC accepts ------------------------------------------------------------------------------------


def test_numbers_written_as_strings():
    config = parse_service_config(json.dumps({
        "methodConfig": [{"name": NAME, "retryPolicy": {
            "maxAttempts": "3", "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": "1.6",
            "retryableStatusCodes": ["UNAVAILABLE"]}, "maxRequestMessageBytes": "1024"}],
        "retryThrottling": {"maxTokens": "10", "tokenRatio": "0.5"}}))
    policy = config.method_config("/pkg.Svc/M").retry_policy
    assert (policy.max_attempts, policy.backoff_multiplier) == (3, 1.6)
    assert config.method_config("/pkg.Svc/M").max_request_message_bytes == 1024
    assert (config.retry_throttling.max_milli_tokens, config.retry_throttling.milli_token_ratio) == (10_000, 500)


@pytest.mark.parametrize("ratio, milli", [(0.1234, 123), ("0.1239", 123), (1.0000001, 1000), ("2.5", 2500)])
def test_token_ratio_keeps_three_decimals_as_grpc_core_does(ratio, milli):
    config = parse_service_config(json.dumps({"retryThrottling": {"maxTokens": 10, "tokenRatio": ratio}}))
    assert config.retry_throttling.milli_token_ratio == milli


def test_token_ratio_below_a_thousandth_is_an_error():
    assert errors(json.dumps({"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.0004}})) == [
        "retryThrottling.tokenRatio: must be at least 0.001"]


def test_hedging_policy_without_non_fatal_codes_makes_every_failure_fatal():
    config = parse_service_config(method(hedgingPolicy={"maxAttempts": 3, "hedgingDelay": "1s"}))
    assert config.method_config("/pkg.Svc/M").hedging_policy.non_fatal_status_codes == frozenset()


def test_empty_lb_policy_and_zero_timeout_are_unset():
    config = parse_service_config(json.dumps({"loadBalancingPolicy": "", "methodConfig": [
        {"name": NAME, "timeout": "0s"}]}))
    assert config.lb_policy is None and config.method_config("/pkg.Svc/M").timeout is None


def test_lb_config_skips_policies_it_lacks_and_says_which_it_took(caplog):
    with caplog.at_level("INFO", logger="grpc_retry"):
        config = parse_service_config(json.dumps({"loadBalancingConfig": [
            {"xds_cluster_manager_experimental": {"children": {}}}, {"weighted_round_robin": {}},
            {"round_robin": {}}]}))
    assert config.lb_policy == "round_robin"
    assert "using round_robin" in caplog.text and "weighted_round_robin" in caplog.text


# -- reject what gRPC rejects --------------------------------------------------------------------------------------


def test_duplicate_keys_anywhere():
    text = ('{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1, "maxTokens": 5}, '
            '"unknown": {"a": 1, "a": 2}}')
    assert sorted(errors(text)) == ["retryThrottling: duplicate key 'maxTokens'", "unknown: duplicate key 'a'"]


@pytest.mark.parametrize("attempts", [2**32, "4294967296", 10**30])
def test_max_attempts_beyond_uint32(attempts):
    assert errors(method(retryPolicy={"maxAttempts": attempts, "initialBackoff": "1s", "maxBackoff": "1s",
                                      "backoffMultiplier": 2, "retryableStatusCodes": [14]})) == [
        "methodConfig[0].retryPolicy.maxAttempts: must be at most 4294967295 (a uint32)"]


@pytest.mark.parametrize("target, words", [
    ("ipv4:127.0.0.1", "has no port"),
    ("ipv4:127.0.0.1:80,10.0.0.1", "has no port"),
    ("ipv6:[::1]", "has no port"),
    ("dns://resolver.example/example.com:443", "the DNS server 'resolver.example' must be an IP address"),
])
def test_targets_grpc_rejects(target, words):
    with pytest.raises(ValueError, match="target .*" + words.replace("(", r"\(").replace(")", r"\)")):
        parse_target(target)


# -- warn about likely mistakes ------------------------------------------------------------------------------------


def test_unknown_keys_are_warned_with_what_was_meant():
    config = parse_service_config(json.dumps({
        "methodConfig": [{"name": NAME, "hedgingPolicy": {"maxAttempts": 3, "hedgeDelay": "1s"},
                          "waitforready": True, "retryPolicyy": {}}],
        "healthCheckConfig": {"serviceName": ""}, "loadBalancingPolcy": "round_robin"}))
    assert sorted(config.warnings) == sorted([
        "methodConfig[0].hedgingPolicy.hedgeDelay: unknown key, ignored (did you mean 'hedgingDelay'?)",
        "methodConfig[0].waitforready: read as 'waitForReady' (gRPC's core reads keys case-sensitively and "
        "would ignore it)",
        "methodConfig[0].retryPolicyy: unknown key, ignored (did you mean 'retryPolicy'?)",
        "loadBalancingPolcy: unknown key, ignored (did you mean 'loadBalancingPolicy'?)",
    ])


@pytest.mark.parametrize("name, where", [
    ({"service": "/pkg.Svc"}, "service"),
    ({"service": "pkg.Svc/Method"}, "service"),
    ({"service": "pkg.Svc", "method": "/Method"}, "method"),
])
def test_names_that_can_never_match_are_warned(name, where):
    (warning,) = parse_service_config(json.dumps({"methodConfig": [{"name": [name]}]})).warnings
    assert warning.startswith(f"methodConfig[0].name[0].{where}: ") and "can never match" in warning


@pytest.mark.parametrize("make", [grpc_retry.insecure_channel])
def test_a_channel_warns_once_and_unknown_grpc_retry_options_are_errors(make):
    text = method(hedgingPolicy={"maxAttempts": 3, "hedgeDelay": "1s"}, timout="1s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make("127.0.0.1:1", options=[("grpc.service_config", text)]).close()
    ours = [w for w in caught if issubclass(w.category, ServiceConfigWarning)]
    assert len(ours) == 1 and "hedgeDelay" in str(ours[0].message) and "timout" in str(ours[0].message)
    assert ours[0].filename == __file__  # points at the application's line
    with pytest.raises(ValueError, match=r"grpc_retry\.max_attempt: unknown grpc_retry option \(did you mean "
                                         r"grpc_retry\.max_attempts\?\)"):
        parse_options([("grpc_retry.max_attempt", 3)])


def test_channels_made_with_one_config_share_its_parse_and_each_still_warns():
    # A parse is most of what making a channel costs: channels with one config text (and attempt cap) share it.
    text = method(retryPolicy={"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s",
                               "backoffMultiplier": 2, "retryableStatusCodes": [14]}, timout="1s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = (parse_options([("grpc.service_config", text)]) for _ in range(2))
        capped = parse_options([("grpc.service_config", text), ("grpc_retry.max_attempts", 1)])
    assert first.service_config is second.service_config
    assert capped.service_config is not first.service_config  # the cap is part of the parse
    assert capped.service_config.method_config("/pkg.Svc/M").retry_policy.max_attempts == 1
    assert len([w for w in caught if issubclass(w.category, ServiceConfigWarning)]) == 3  # each channel's own
    broken = method(retryPolicy={"maxAttempts": 1})
    for _ in range(2):  # an invalid config is never kept: each channel made with it fails
        with pytest.raises(ServiceConfigError):
            parse_options([("grpc.service_config", broken)])


# -- the published examples -----------------------------------------------------------------------------------------

# Written out from the published texts: gRPC's retry guide, grpc-java's retrying and hedging examples, grpc-go's
# retry example (whose keys are capitalised, as Go reads them), and the service config doc's example.
PUBLISHED = {
    "grpc.io retry guide": """{"methodConfig": [{"name": [{"service": "grpc.examples.echo.Echo"}],
        "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]}""",
    "grpc-java retrying": """{"methodConfig": [{"name": [{"service": "helloworld.Greeter", "method": "SayHello"}],
        "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.5s", "maxBackoff": "30s", "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]}}]}""",
    "grpc-java hedging": """{"methodConfig": [{"name": [{"service": "helloworld.Greeter", "method": "SayHello"}],
        "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "1s"}}]}""",
    "grpc-go retry": """{"methodConfig": [{"name": [{"service": "grpc.examples.echo.Echo"}], "waitForReady": true,
        "retryPolicy": {"MaxAttempts": 4, "InitialBackoff": ".01s", "MaxBackoff": ".01s",
        "BackoffMultiplier": 1.0, "RetryableStatusCodes": [ "UNAVAILABLE" ]}}]}""",
    "service config doc": """{"loadBalancingConfig": [{"round_robin": {}}], "methodConfig": [{"name": [
        {"service": "foo", "method": "bar"}, {"service": "baz"}], "timeout": "1.000000001s"}]}""",
    "A6 throttling": """{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}""",
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_examples_are_accepted(name):
    config = parse_service_config(PUBLISHED[name])
    assert config is not None
    if name == "grpc-go retry":
        assert config.method_config("/grpc.examples.echo.Echo/UnaryEcho").retry_policy.max_attempts == 4
    if name == "grpc-java hedging":
        assert config.method_config("/helloworld.Greeter/SayHello").hedging_policy.max_attempts == 3


async def test_an_aio_channel_warns_once_at_the_applications_line():
    import grpc_retry.aio

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        channel = grpc_retry.aio.insecure_channel("127.0.0.1:1", options=[("grpc.service_config", method(
            retryPolicy={"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                         "retryableStatusCodes": [14], "retryableStatuscode": []}))])
    await channel.close()
    ours = [w for w in caught if issubclass(w.category, ServiceConfigWarning)]
    assert len(ours) == 1 and ours[0].filename == __file__
    assert "retryableStatuscode: unknown key, ignored (did you mean 'retryableStatusCodes'?)" in str(ours[0].message)
