"""RouteConfiguration (RDS) resources, checked as gRPC's core checks them, and a call's route chosen as gRPC chooses
it (gRFC A28): the virtual host whose domain pattern is most specific for the target's name, then the first route
whose path, headers and runtime fraction match; its cluster (or one of its weighted clusters, gRFC A31) and its
retry policy (the route's, else the virtual host's; gRFC A44). Routes no gRPC call can match, or whose action names
no cluster a client understands, are left out, as gRPC leaves them."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Tuple

from envoy.config.route.v3 import route_pb2
from envoy.type.v3 import percent_pb2

from grpc_retry._backends.xds import fault, hash_policy
from grpc_retry._backends.xds.errors import Errors, parsed
from grpc_retry._backends.xds.fault import Fault
from grpc_retry._backends.xds.hash_policy import RequestHash
from grpc_retry._config import RetryPolicy as ServiceRetryPolicy

# The retry_on conditions gRPC honours (A44), and the status codes they name
RETRY_CODES = {"cancelled": 1, "deadline-exceeded": 4, "internal": 13, "resource-exhausted": 8, "unavailable": 14}
Overrides = Tuple[Tuple[str, Optional[Fault]], ...]  # a typed_per_filter_config's fault filters, by name

_PER_MILLION = {percent_pb2.FractionalPercent.HUNDRED: 10000, percent_pb2.FractionalPercent.TEN_THOUSAND: 100,
                percent_pb2.FractionalPercent.MILLION: 1}
_UINT32 = 2 ** 32 - 1
MAX_SECONDS = 315576000000


@dataclass(frozen=True)
class RetryPolicy:
    """A route's retry policy (A44): the codes it retries (none: no retries), attempts (num_retries + 1, before
    the client's cap) and backoff bounds in seconds."""

    codes: FrozenSet[str]
    max_attempts: int
    initial_backoff: float
    max_backoff: float

    def retry_policy(self, max_attempts_cap: int) -> Optional[ServiceRetryPolicy]:
        """As a service config's retryPolicy (A44): None when it names no code gRPC retries (no retries); the
        attempts under the client's cap, backoff multiplier 2. ValueError for a zero backoff, which gRPC's
        resolver refuses as well."""
        if not self.codes:
            return None
        if self.initial_backoff <= 0 or self.max_backoff <= 0:
            raise ValueError(f"retry_back_off: intervals must be greater than 0 (base {self.initial_backoff} s, "
                             f"max {self.max_backoff} s)")
        return ServiceRetryPolicy(max_attempts=min(self.max_attempts, max_attempts_cap),
                                  initial_backoff=self.initial_backoff, max_backoff=self.max_backoff,
                                  backoff_multiplier=2.0,
                                  retryable_status_codes=frozenset(RETRY_CODES[c] for c in self.codes))


@dataclass(frozen=True)
class HeaderMatcher:
    name: str
    test: Callable[[Optional[str]], bool]  # the header's value (None: absent) -> matches, before invert
    invert: bool
    presence: bool = False  # a present_match: the only kind an absent header can match


@dataclass(frozen=True)
class Route:
    path: Callable[[str], bool]
    headers: Tuple[HeaderMatcher, ...]
    fraction: Optional[int]  # per million, or None: always
    clusters: Tuple[Tuple[str, int], ...]  # (name, weight); empty: an action no call can take
    retry_policy: Optional[RetryPolicy]
    has_retry_policy: bool
    max_stream_duration: Optional[float]
    request_hash: Optional[RequestHash] = None  # its hash policies (None: none)
    # typed_per_filter_config of fault filters, by filter name (None: disabled): the route's, and its weighted
    # clusters' by cluster name
    filter_overrides: Overrides = ()
    cluster_overrides: Tuple[Tuple[str, Overrides], ...] = ()

    def matches(self, path: str, metadata: Mapping[str, str], draw: Callable[[], int]) -> bool:
        if not self.path(path):
            return False
        for matcher in self.headers:
            value = None if matcher.name.endswith("-bin") else (
                "application/grpc" if matcher.name == "content-type" else metadata.get(matcher.name))
            if value is None and not matcher.presence:
                return False  # (whatever invert says)
            if matcher.test(value) == matcher.invert:
                return False
        return self.fraction is None or draw() % 1_000_000 < self.fraction

    def pick_cluster(self, draw: Callable[[int], int] = random.randrange) -> Optional[str]:
        """The call's cluster, chosen once (A31): by weight among the weighted clusters."""
        if not self.clusters:
            return None
        if len(self.clusters) == 1:
            return self.clusters[0][0]
        point = draw(sum(weight for _, weight in self.clusters))
        for name, weight in self.clusters:
            if point < weight:
                return name
            point -= weight
        return self.clusters[-1][0]


@dataclass(frozen=True)
class VirtualHost:
    domains: Tuple[str, ...]
    routes: Tuple[Route, ...]
    retry_policy: Optional[RetryPolicy]
    filter_overrides: Overrides = ()

    def cluster_names(self) -> FrozenSet[str]:
        return frozenset(name for route in self.routes for name, _ in route.clusters)

    def route(self, path: str, metadata: Mapping[str, str],
              draw: Callable[[], int] = lambda: random.randrange(1_000_000)) -> Optional[Route]:
        return next((r for r in self.routes if r.matches(path, metadata, draw)), None)

    def faults_of(self, route: Route, cluster: str, faults: Tuple[Tuple[str, Fault], ...]) -> Tuple[Fault, ...]:
        """The fault configs a call routed by `route` to `cluster` runs: each of the listener's `faults` filters
        (name, config), overridden whole by the weighted cluster's, else the route's, else this host's config
        for that name (A39), and left out where one disables it."""
        if not faults:  # (most listeners have no fault filter: nothing to look up per call)
            return ()
        found = []
        weighted = dict(dict(route.cluster_overrides).get(cluster, ()))
        by_route, by_host = dict(route.filter_overrides), dict(self.filter_overrides)
        for name, config in faults:
            chosen: Optional[Fault] = config
            for overrides in (weighted, by_route, by_host):
                if name in overrides:
                    chosen = overrides[name]
                    break
            if chosen is not None:
                found.append(chosen)
        return tuple(found)

    def retry_policy_of(self, route: Route) -> Optional[RetryPolicy]:
        """A route's own policy replaces the virtual host's whole (A44)."""
        return route.retry_policy if route.has_retry_policy else self.retry_policy


@dataclass(frozen=True)
class RouteConfiguration:
    name: str
    virtual_hosts: Tuple[VirtualHost, ...]

    def virtual_host(self, authority: str) -> Optional[VirtualHost]:
        """The virtual host for `authority`: exact, then suffix, then prefix patterns, then "*"; the longest
        pattern of a kind; the first on a tie."""
        best: Optional[Tuple[int, int]] = None
        chosen = None
        host = authority.lower()
        for vhost in self.virtual_hosts:
            for domain in vhost.domains:
                rank = _domain_rank(domain.lower(), host)
                if rank is not None and (best is None or rank < best):
                    best, chosen = rank, vhost
                    if rank[0] == 0:
                        return chosen
        return chosen


def decode(data: bytes) -> Tuple[str, RouteConfiguration]:
    config = parsed(route_pb2.RouteConfiguration, data, "RouteConfiguration")
    errors = Errors("RouteConfiguration", config.name)
    value = read(config, "", errors)
    errors.raise_if_any()
    return config.name, value


def read(config: Any, where: str, errors: Errors) -> RouteConfiguration:
    """A RouteConfiguration message (an RDS resource, or one inline in a Listener at `where`)."""
    prefix = f"{where}." if where else ""
    plugins = _plugins(config, prefix, errors)
    hosts = []
    for i, vhost in enumerate(config.virtual_hosts):
        at = f"{prefix}virtual_hosts[{i}]"
        if not vhost.domains:
            errors.add(f"{at}.domains", "must be non-empty")
        for j, domain in enumerate(vhost.domains):
            if _domain_kind(domain) is None:
                errors.add(f"{at}.domains[{j}]", f'invalid domain pattern "{domain}"')
        policy = _retry_policy(vhost.retry_policy, f"{at}.retry_policy", errors) \
            if vhost.HasField("retry_policy") else None
        found = (_route(r, f"{at}.routes[{j}]", errors, plugins) for j, r in enumerate(vhost.routes))
        hosts.append(VirtualHost(tuple(vhost.domains), tuple(r for r in found if r is not None), policy,
                                 _overrides(vhost.typed_per_filter_config, f"{at}.typed_per_filter_config", errors)))
    return RouteConfiguration(config.name, tuple(hosts))


def _plugins(config: Any, prefix: str, errors: Errors) -> Dict[str, bool]:
    """The cluster specifier plugins: name -> whether a client can use it (none can here: RLS is not run)."""
    plugins: Dict[str, bool] = {}
    for i, plugin in enumerate(config.cluster_specifier_plugins):
        at = f"{prefix}cluster_specifier_plugins[{i}].extension"
        if not plugin.HasField("extension"):
            errors.add(at, "field not present")
            continue
        if plugin.extension.name in plugins:
            errors.add(f"{at}.name", f'duplicate name "{plugin.extension.name}"')
            continue
        kind = plugin.extension.typed_config.type_url.rsplit("/", 1)[-1]
        if kind != "grpc.lookup.v1.RouteLookupClusterSpecifier" and not plugin.is_optional:
            errors.add(f"{at}.typed_config", "unsupported ClusterSpecifierPlugin type")
        plugins[plugin.extension.name] = False
    return plugins


def _route(route: Any, at: str, errors: Errors, plugins: Dict[str, bool]) -> Optional[Route]:
    if not route.HasField("match"):
        errors.add(f"{at}.match", "field not present")
        return None
    match = route.match
    if len(match.query_parameters):
        return None  # (no gRPC call has a query)
    path = _path_matcher(match, f"{at}.match", errors)
    headers = tuple(h for h in (_header(m, f"{at}.match.headers[{k}]", errors)
                                for k, m in enumerate(match.headers)) if h is not None)
    fraction = None
    if match.HasField("runtime_fraction"):
        value = match.runtime_fraction.default_value
        scale = _PER_MILLION.get(value.denominator)
        if scale is None:
            errors.add(f"{at}.match.runtime_fraction.default_value.denominator", "unknown denominator type")
        else:
            fraction = value.numerator * scale
    policy = None
    clusters: Tuple[Tuple[str, int], ...] = ()
    duration = None
    request_hash = None
    cluster_overrides: Tuple[Tuple[str, Overrides], ...] = ()
    if route.HasField("route"):
        action = route.route
        if action.HasField("cluster"):
            if not action.cluster:
                errors.add(f"{at}.route.cluster", "must be non-empty")
            clusters = ((action.cluster, 1),)
        elif action.HasField("weighted_clusters"):
            clusters = _weighted(action.weighted_clusters, f"{at}.route.weighted_clusters", errors)
        elif action.HasField("cluster_specifier_plugin"):
            name = action.cluster_specifier_plugin
            if not name:
                errors.add(f"{at}.route.cluster_specifier_plugin", "must be non-empty")
            elif name not in plugins:
                errors.add(f"{at}.route.cluster_specifier_plugin", f'unknown cluster specifier plugin name "{name}"')
            return None  # (a lookup service chooses: not run here)
        else:
            return None  # cluster_header and the like: no cluster a client knows
        if action.HasField("retry_policy"):
            policy = _retry_policy(action.retry_policy, f"{at}.route.retry_policy", errors)
        duration = _max_stream_duration(action, f"{at}.route.max_stream_duration", errors)
        request_hash = hash_policy.parse(action, f"{at}.route", errors)
        if action.HasField("weighted_clusters"):
            by_cluster = ((weight.name, _overrides(weight.typed_per_filter_config,
                                                   f"{at}.route.weighted_clusters.clusters[{k}].typed_per_filter_config",
                                                   errors))
                          for k, weight in enumerate(action.weighted_clusters.clusters))
            cluster_overrides = tuple((name, found) for name, found in by_cluster if found)
    if path is None:
        return None
    return Route(path, headers, fraction, clusters, policy, route.HasField("route") and
                 route.route.HasField("retry_policy"), duration, request_hash,
                 _overrides(route.typed_per_filter_config, f"{at}.typed_per_filter_config", errors),
                 cluster_overrides)


def _overrides(configs: Any, at: str, errors: Errors) -> Overrides:
    """The fault filters' entries of a typed_per_filter_config, by filter name (None: disabled there)."""
    found = []
    for name in sorted(configs):
        if not name:
            errors.add(at, "filter name must be non-empty")
            continue
        ours, config = fault.override(configs[name], f"{at}[{name}]", errors)
        if ours:
            found.append((name, config))
    return tuple(found)


def _path_matcher(match: Any, at: str, errors: Errors) -> Optional[Callable[[str], bool]]:
    sensitive = not match.HasField("case_sensitive") or match.case_sensitive.value
    kind = match.WhichOneof("path_specifier")
    if kind == "prefix":
        prefix = match.prefix
        if prefix and (not prefix.startswith("/") or prefix.count("/") > 2 or prefix.startswith("//")):
            return None  # no gRPC path can match
        return _text_test(prefix, sensitive, str.startswith)
    if kind == "path":
        parts = match.path.split("/")
        if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
            return None
        return _text_test(match.path, sensitive, str.__eq__)
    if kind == "safe_regex":
        pattern = _regex(match.safe_regex.regex, at, errors, "error creating path matcher: ")
        return None if pattern is None else (lambda path: pattern.fullmatch(path) is not None)
    errors.add(at, "invalid path specifier")
    return None


def _text_test(expected: str, sensitive: bool, test: Callable[[str, str], bool]) -> Callable[[str], bool]:
    if sensitive:
        return lambda value: test(value, expected)
    lowered = expected.lower()
    return lambda value: test(value.lower(), lowered)


def _header(matcher: Any, at: str, errors: Errors) -> Optional[HeaderMatcher]:
    kind = matcher.WhichOneof("header_match_specifier")
    test: Optional[Callable[[Optional[str]], bool]] = None
    if kind in ("exact_match", "prefix_match", "suffix_match", "contains_match"):
        test = _text(kind[:-len("_match")], getattr(matcher, kind), False)
    elif kind == "present_match":
        expected = matcher.present_match
        return HeaderMatcher(matcher.name, lambda v: (v is not None) == expected, matcher.invert_match, True)
    elif kind == "safe_regex_match":
        pattern = _regex(matcher.safe_regex_match.regex, at, errors, "cannot create header matcher: ")
        test = None if pattern is None else _full(pattern)
    elif kind == "range_match":
        low, high = matcher.range_match.start, matcher.range_match.end
        if high < low:
            errors.add(at, "cannot create header matcher: Invalid range specifier specified: end cannot be smaller "
                           "than start.")
            return None
        test = _valued(lambda v: _in_range(v, low, high))
    elif kind == "string_match":
        test = _string_match(matcher.string_match, f"{at}.string_match", errors)
    else:
        errors.add(at, "invalid header matcher")
    if test is None:
        return None
    return HeaderMatcher(matcher.name, test, matcher.invert_match)


def _string_match(match: Any, at: str, errors: Errors) -> Optional[Callable[[Optional[str]], bool]]:
    kind = match.WhichOneof("match_pattern")
    fold = match.ignore_case
    if kind == "safe_regex":
        if fold:
            errors.add(f"{at}.ignore_case", "not supported for regex matcher")
            return None
        pattern = _regex(match.safe_regex.regex, at, errors, "")
        return None if pattern is None else _full(pattern)
    if kind not in _TESTS:
        errors.add(at, "invalid string matcher")
        return None
    return _text(kind, getattr(match, kind), fold)


_TESTS: Dict[str, Callable[[str, str], bool]] = {"exact": str.__eq__, "prefix": str.startswith,
                                                 "suffix": str.endswith, "contains": lambda v, e: e in v}


def _text(kind: str, expected: str, fold: bool) -> Callable[[Optional[str]], bool]:
    test = _TESTS[kind]
    if fold:
        lowered = expected.lower()
        return _valued(lambda v: test(v.lower(), lowered))
    return _valued(lambda v: test(v, expected))


def _full(pattern: re.Pattern[str]) -> Callable[[Optional[str]], bool]:
    return _valued(lambda v: pattern.fullmatch(v) is not None)


def _valued(test: Callable[[str], bool]) -> Callable[[Optional[str]], bool]:
    return lambda value: value is not None and test(value)


def _in_range(value: str, low: int, high: int) -> bool:
    try:
        number = int(value)
    except ValueError:
        return False
    return low <= number < high


def _regex(pattern: str, at: str, errors: Errors, prefix: str) -> Optional[re.Pattern[str]]:
    try:
        return re.compile(pattern)
    except re.error as error:
        errors.add(at, f"{prefix}Invalid regex string specified in matcher: {error}")
        return None


def _weighted(weighted: Any, at: str, errors: Errors) -> Tuple[Tuple[str, int], ...]:
    clusters = []
    for n, cluster in enumerate(weighted.clusters):
        if not cluster.name:
            errors.add(f"{at}.clusters[{n}].name", "must be non-empty")
        if not cluster.HasField("weight"):
            errors.add(f"{at}.clusters[{n}].weight", "field not present")
        elif cluster.weight.value > 0:
            clusters.append((cluster.name, cluster.weight.value))
    if not clusters:
        errors.add(at, "no valid clusters specified")
    elif sum(weight for _, weight in clusters) > _UINT32:
        errors.add(at, "sum of cluster weights exceeds uint32 max")
    return tuple(clusters)


def _retry_policy(policy: Any, at: str, errors: Errors) -> RetryPolicy:
    codes = frozenset(code for code in policy.retry_on.split(",") if code in RETRY_CODES)
    retries = policy.num_retries.value if policy.HasField("num_retries") else 1
    if policy.HasField("num_retries") and retries == 0:
        errors.add(f"{at}.num_retries", "must be greater than 0")
    initial, maximum = 0.025, 0.25
    if policy.HasField("retry_back_off"):
        back_off = policy.retry_back_off
        if not back_off.HasField("base_interval"):
            errors.add(f"{at}.retry_back_off.base_interval", "field not present")
        else:
            initial = duration(back_off.base_interval, f"{at}.retry_back_off.base_interval", errors) or 0.0
            maximum = initial * 10
        if back_off.HasField("max_interval"):
            maximum = duration(back_off.max_interval, f"{at}.retry_back_off.max_interval", errors) or 0.0
    return RetryPolicy(codes, retries + 1, initial, maximum)


def _max_stream_duration(action: Any, at: str, errors: Errors) -> Optional[float]:
    if not action.HasField("max_stream_duration"):
        return None
    limits = action.max_stream_duration
    for field in ("grpc_timeout_header_max", "max_stream_duration"):
        if limits.HasField(field):
            return duration(getattr(limits, field), f"{at}.{field}", errors)
    return None


def duration(value: Any, at: str, errors: Errors) -> Optional[float]:
    """A protobuf Duration in seconds, checked as gRPC checks one."""
    ok = True
    if not 0 <= value.seconds <= MAX_SECONDS:
        errors.add(f"{at}.seconds", f"value must be in the range [0, {MAX_SECONDS}]")
        ok = False
    if not 0 <= value.nanos <= 999_999_999:
        errors.add(f"{at}.nanos", "value must be in the range [0, 999999999]")
        ok = False
    return value.seconds + value.nanos / 1e9 if ok else None


def _domain_kind(domain: str) -> Optional[int]:
    """0 exact, 1 suffix ("*.x"), 2 prefix ("x.*"), 3 universal ("*"); None: not a pattern gRPC accepts."""
    if not domain:
        return None
    if "*" not in domain:
        return 0
    if domain == "*":
        return 3
    if domain.startswith("*") and "*" not in domain[1:]:
        return 1
    if domain.endswith("*") and "*" not in domain[:-1]:
        return 2
    return None


def _domain_rank(domain: str, host: str) -> Optional[Tuple[int, int]]:
    """How well `domain` matches `host` (lower is better), or None."""
    kind = _domain_kind(domain)
    if kind == 0 and domain == host:
        return (0, 0)
    if kind == 1 and len(host) > len(domain) - 1 and host.endswith(domain[1:]):
        return (1, -len(domain))
    if kind == 2 and len(host) > len(domain) - 1 and host.startswith(domain[:-1]):
        return (2, -len(domain))
    if kind == 3:
        return (3, 0)
    return None

