"""Messages that name the fix: a "did you mean" wherever a name is close to a known one (service-config keys,
status codes, LB policies, channel options), public exceptions under their public names, and a package that
writes nothing on stderr unless asked to."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import traceback
import warnings

import pytest

import grpc_retry
import grpc_retry.aio
import grpc_retry.strategy
from grpc_retry import ServiceConfigError, ServiceConfigWarning
from grpc_retry._config import parse_service_config
from grpc_retry._options import parse_options
from grpc_retry._suggest import closest, did_you_mean

NAME = [{"service": "pkg.Svc"}]
RETRY = {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
         "retryableStatusCodes": ["UNAVAILABLE"]}


def errors_of(doc: object) -> list[str]:
    with pytest.raises(ServiceConfigError) as caught:
        parse_service_config(json.dumps(doc))
    return caught.value.errors


def retry_with(drop: str = "", **changes: object) -> dict[str, object]:
    policy = {**{k: v for k, v in RETRY.items() if k != drop}, **changes}
    return {"methodConfig": [{"name": NAME, "retryPolicy": policy}]}


# -- the shared helper ----------------------------------------------------------------------------------------------


def test_the_closest_known_name_case_aside_or_none():
    assert closest("initalBackoff", ("maxBackoff", "initialBackoff")) == "initialBackoff"
    assert closest("unavailable", ("UNKNOWN", "UNAVAILABLE")) == "UNAVAILABLE"
    assert closest("zzz", ("pick_first", "round_robin")) is None
    assert did_you_mean("round_robbin", ("pick_first", "round_robin")) == " (did you mean 'round_robin'?)"
    assert did_you_mean("zzz", ("pick_first",)) == ""


# -- service-config keys --------------------------------------------------------------------------------------------


def test_a_missing_required_key_names_its_misspelling():
    assert errors_of(retry_with("initialBackoff", initalBackoff="0.1s")) == [
        "methodConfig[0].retryPolicy.initialBackoff: is required (found 'initalBackoff': did you mean "
        "'initialBackoff'?)"]


def test_a_missing_required_key_with_nothing_close_says_only_that():
    assert errors_of(retry_with("maxBackoff")) == ["methodConfig[0].retryPolicy.maxBackoff: is required"]


@pytest.mark.parametrize("doc, error", [
    ({"retryThrottling": {"maxToken": 10, "tokenRatio": 0.1}},
     "retryThrottling.maxTokens: is required (found 'maxToken': did you mean 'maxTokens'?)"),
    ({"loadBalancingConfig": [{"outlier_detection_experimental": {"childPolicies": [{"round_robin": {}}]}}]},
     "loadBalancingConfig[0].outlier_detection_experimental.childPolicy: is required (found 'childPolicies': did "
     "you mean 'childPolicy'?)"),
    ({"methodConfig": [{"name": NAME, "hedgingPolicy": {"maxAttemps": 3}}]},
     "methodConfig[0].hedgingPolicy.maxAttempts: is required (found 'maxAttemps': did you mean 'maxAttempts'?)"),
])
def test_every_required_key_names_its_misspelling(doc, error):
    assert errors_of(doc) == [error]


def test_the_misspelt_key_is_still_warned_when_the_config_is_valid():
    doc = {"methodConfig": [{"name": NAME, "retryPolicy": RETRY, "waitForReadyy": True}]}
    assert parse_service_config(json.dumps(doc)).warnings == (
        "methodConfig[0].waitForReadyy: unknown key, ignored (did you mean 'waitForReady'?)",)


# -- status codes: still errors, now with what was meant -----------------------------------------------------------


def test_a_misspelt_status_code_is_an_error_that_names_the_code():
    assert errors_of(retry_with(retryableStatusCodes=["UNAVAILIBLE", "unavailable", "DEADLINE_EXCEDED"])) == [
        "methodConfig[0].retryPolicy.retryableStatusCodes[0]: unknown status code 'UNAVAILIBLE' (did you mean "
        "'UNAVAILABLE'?)",
        # gRPC reads names case-sensitively: an error still, with the spelling it reads.
        "methodConfig[0].retryPolicy.retryableStatusCodes[1]: unknown status code 'unavailable' (did you mean "
        "'UNAVAILABLE'?)",
        "methodConfig[0].retryPolicy.retryableStatusCodes[2]: unknown status code 'DEADLINE_EXCEDED' (did you "
        "mean 'DEADLINE_EXCEEDED'?)"]


def test_non_fatal_codes_too_and_no_suggestion_for_numbers_nor_ok():
    doc = {"methodConfig": [{"name": NAME, "hedgingPolicy": {"maxAttempts": 2, "nonFatalStatusCodes": [
        "ABORTD", 99, "OKAY", "NOTHING_LIKE_IT"]}}]}
    assert errors_of(doc) == [
        "methodConfig[0].hedgingPolicy.nonFatalStatusCodes[0]: unknown status code 'ABORTD' (did you mean "
        "'ABORTED'?)",
        "methodConfig[0].hedgingPolicy.nonFatalStatusCodes[1]: unknown status code 99",
        "methodConfig[0].hedgingPolicy.nonFatalStatusCodes[2]: unknown status code 'OKAY'",  # OK is never valid
        "methodConfig[0].hedgingPolicy.nonFatalStatusCodes[3]: unknown status code 'NOTHING_LIKE_IT'"]


# -- load-balancing policy names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, error", [
    ("round_robbin", "loadBalancingPolicy: unsupported policy 'round_robbin' (did you mean 'round_robin'?)"),
    ("pickfirst", "loadBalancingPolicy: unsupported policy 'pickfirst' (did you mean 'pick_first'?)"),
    # Another client's policy is not taken for a misspelling of ours.
    ("weighted_round_robin", "loadBalancingPolicy: unsupported policy 'weighted_round_robin' (supported: "
                             "pick_first, round_robin)"),
    ("xyz", "loadBalancingPolicy: unsupported policy 'xyz' (supported: pick_first, round_robin)"),
])
def test_load_balancing_policy(name, error):
    assert errors_of({"loadBalancingPolicy": name}) == [error]


def test_load_balancing_config_with_only_a_misspelt_policy_is_an_error_naming_it():
    assert errors_of({"loadBalancingConfig": [{"round_robbin": {}}]}) == [
        "loadBalancingConfig: no supported policy (found 'round_robbin': did you mean 'round_robin'?)"]
    assert errors_of({"loadBalancingConfig": [{"grpclb": {}}]}) == [
        "loadBalancingConfig: no supported policy (supported: pick_first, round_robin, "
        "outlier_detection_experimental, ring_hash_experimental)"]


def test_a_misspelt_policy_skipped_for_a_later_one_is_warned():
    # gRPC skips it and uses the next one: valid, but the misspelt one was most likely meant.
    config = parse_service_config(json.dumps({"loadBalancingConfig": [{"round_robbin": {}}, {"pick_first": {}}]}))
    assert config.lb_policy == "pick_first"
    assert config.warnings == ("loadBalancingConfig[0].round_robbin: unknown policy, skipped (did you mean "
                               "'round_robin'?)",)
    other = parse_service_config(json.dumps({"loadBalancingConfig": [{"weighted_round_robin": {}},
                                                                     {"round_robin": {}}]}))
    assert other.lb_policy == "round_robin" and other.warnings == ()


def test_the_lb_policy_option():
    with pytest.raises(ValueError, match=r"channel option grpc\.lb_policy_name: must be one of pick_first, "
                                         r"round_robin, got 'round_robbin' \(did you mean 'round_robin'\?\)$"):
        parse_options([("grpc.lb_policy_name", "round_robbin")])
    with pytest.raises(ValueError, match=r"got 'grpclb'$"):
        parse_options([("grpc.lb_policy_name", "grpclb")])


# -- channel options --------------------------------------------------------------------------------------------


def test_a_misspelt_grpc_retry_option_is_an_error_naming_the_option():
    with pytest.raises(ValueError, match=r"grpc_retry\.max_attempt: unknown grpc_retry option \(did you mean "
                                         r"grpc_retry\.max_attempts\?\)"):
        parse_options([("grpc_retry.max_attempt", 3)])


@pytest.mark.parametrize("name, meant", [
    ("grpc.service_confg", "grpc.service_config"),
    ("grpc.enable_retry", "grpc.enable_retries"),
    ("grpc.max_attempts", "grpc_retry.max_attempts"),  # ours, under grpc's prefix
    ("grpc.Inhibit_Health_Checking", "grpc.inhibit_health_checking"),
])
def test_a_near_miss_of_an_option_grpc_retry_reads_is_warned_and_still_passed_on(name, meant):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        options = parse_options([(name, 1)])
    (warning,) = caught
    assert warning.category is UserWarning and warning.filename == __file__  # at the application's line
    assert str(warning.message) == (f"channel option {name}: not one grpc_retry reads; passed on to grpcio, which "
                                    f"ignores names it does not know (did you mean {meant}?)")
    assert (name, 1) in options.passthrough


def test_grpcio_options_pass_on_without_a_word():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        options = parse_options([("grpc.max_receive_message_length", 10), ("grpc.keepalive_time_ms", 1000),
                                 ("grpc.inhibit_health_checking", 1), ("grpc.enable_http_proxy", 0),
                                 ("grpc.service_config_disable_resolution", 1), ("grpc.primary_user_agent", "x"),
                                 ("grpc.dns_min_time_between_resolutions_ms", 100)])
    assert len(options.passthrough) == 7


# -- public exceptions under their public names -------------------------------------------------------------------


def _public_exceptions():
    for module in (grpc_retry, grpc_retry.aio, grpc_retry.strategy):
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, BaseException):
                yield module, value


def test_every_public_exception_is_named_where_it_is_imported_from():
    found = list(_public_exceptions())
    assert {cls.__name__ for _, cls in found} >= {"ServiceConfigError", "ServiceConfigWarning", "RetryStrategyError",
                                                  "TooManyAttemptsError", "CapacityUnavailable"}
    for module, cls in found:
        assert cls.__module__ == module.__name__, cls
        assert getattr(sys.modules[cls.__module__], cls.__qualname__) is cls


def test_a_service_config_error_prints_and_pickles_under_its_public_name():
    with pytest.raises(ServiceConfigError) as caught:
        grpc_retry.insecure_channel("localhost:1", options=[("grpc.service_config", '{"methodConfig": 1}')])
    error = caught.value
    assert repr(type(error)) == "<class 'grpc_retry.ServiceConfigError'>"
    assert traceback.format_exception_only(type(error), error)[-1] == (
        "grpc_retry.ServiceConfigError: invalid service config: methodConfig: must be a list\n")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ServiceConfigError and copy.errors == error.errors and str(copy) == str(error)


@pytest.mark.parametrize("make", [
    lambda: ServiceConfigWarning("service config: x: unknown key, ignored"),
    lambda: grpc_retry.strategy.TooManyAttemptsError("gave up", attempts=3),
    lambda: grpc_retry.strategy.CapacityUnavailable(0.5),
])
def test_the_others_pickle(make):
    value = make()
    copy = pickle.loads(pickle.dumps(value))
    assert type(copy) is type(value) and str(copy) == str(value) and vars(copy) == vars(value)


# -- nothing on stderr unless asked ---------------------------------------------------------------------------------


def test_the_package_logger_has_a_null_handler():
    assert any(type(h) is logging.NullHandler for h in logging.getLogger("grpc_retry").handlers)


def test_a_warning_logged_with_logging_unconfigured_prints_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GRPC_RETRY_TRACE"}
    script = "import logging, grpc_retry\nlogging.getLogger('grpc_retry.x').warning('not for stderr')\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0 and done.stderr == ""
    configured = "import logging; logging.basicConfig()\n" + script  # the application asked: it is shown
    done = subprocess.run([sys.executable, "-c", configured], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=env)
    assert done.stderr == "WARNING:grpc_retry.x:not for stderr\n"
