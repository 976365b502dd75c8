"""An `xds:` channel's backends: the target's config followed (config.py), a set of subchannels per cluster fed
by its endpoints (EDS) or its DNS name (LOGICAL_DNS), and per call the route (A28) and the cluster it sends the
call to (A31: chosen once per call), with the route's retry policy (A44).

A call's attempts all go through its cluster's subchannels, so every retry and hedge stays in the cluster and its
picker sends each to an endpoint the call has not used. The flavor (sync or aio) makes the subchannels and says
where the config is applied (`where`): the client's thread, or the channel's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import random
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple
from urllib.parse import urlsplit

import grpc

from grpc_retry._backends.target import Target
from grpc_retry._backends.xds.bootstrap import load
from grpc_retry._backends.xds.client import XdsClient
from grpc_retry._backends.xds.cluster_impl import ClusterImpl
from grpc_retry._backends.xds.config import ConfigWatcher, XdsConfig
from grpc_retry._backends.xds.errors import RouteError
from grpc_retry._backends.xds.fault import Fault, decide
from grpc_retry._backends.xds.hash_policy import RequestHash
from grpc_retry._backends.xds.lb_policy import RING_HASH, Replacements, subchannel_policy
from grpc_retry._backends.xds.load_report import Source
from grpc_retry._backends.xds.localities import empty, locality_of
from grpc_retry._backends.xds.priorities import Endpoints, priorities, serving
from grpc_retry._backends.xds.routes import RetryPolicy as RouteRetryPolicy
from grpc_retry._config import RetryPolicy
from grpc_retry._options import RetryOptions

log = logging.getLogger("grpc_retry")

NO_ROUTE = "No matching route found in xDS route config"  # grpcio's words
NO_ACTION = "Matching route has inappropriate action"
NO_CLUSTER = "CDS resource {}: does not exist (node ID:{})"
NO_LISTENER = "empty address list ({} (node ID:{}))"

# A route's policy that names no code gRPC retries: the route asks for no retries (A44), whatever the channel's
# service config says.
NO_RETRIES = RetryPolicy(max_attempts=1, initial_backoff=1.0, max_backoff=1.0, backoff_multiplier=1.0,
                         retryable_status_codes=frozenset())

MakeSubchannels = Callable[[Any, RetryOptions], Any]  # (a Target or target string, its options) -> Subchannels


@dataclasses.dataclass
class _Cluster:
    """One cluster of the channel: its subchannels (and what they were made for), its admission of calls (drops
    and circuit breaker), and, for EDS, its endpoints with their shares per priority and those its subchannels
    were last given."""

    subchannels: Any
    made: Tuple[Any, ...]
    admission: ClusterImpl = dataclasses.field(default_factory=ClusterImpl)
    priorities: Optional[List[Endpoints]] = None
    given: Optional[Endpoints] = None
    empty: str = ""  # why its endpoints, if none, are none (grpcio's words; "": ours)
    localities: Dict[str, Any] = dataclasses.field(default_factory=dict)  # target -> its locality (LRS)
    leaves: Set[str] = dataclasses.field(default_factory=set)  # an aggregate's LOGICAL_DNS leaves it watches
    config: Any = None  # an aggregate's: the config it last took its leaves from
    loads: Optional[Source] = None  # what its load reports read (None: it sends none)


class XdsRouter:
    """An `xds:` channel's backends (see above). `aside` runs the close of a retired cluster's subchannels, once
    its last call has ended, off the thread that ended it (maybe grpcio's, where no channel may be closed); None:
    where the config is applied."""

    def __init__(self, target: str, options: RetryOptions, make: MakeSubchannels,
                 where: Callable[[], Callable[[Callable[[], None]], None]],
                 aside: Optional[Callable[[Callable[[], None]], Any]] = None) -> None:
        parts = urlsplit(target)
        name = parts.path.lstrip("/")
        bootstrap = load()  # a BootstrapError (a ValueError) names every bad field, at channel creation
        listener = bootstrap.listener_name(parts.netloc, name)
        self.authority = name  # the virtual host is chosen for it; the subchannels send it as :authority
        self._options = options
        self._make = make
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._config: Optional[XdsConfig] = None
        self._error: Optional[str] = None  # why there is no config (none yet: None)
        self._waiters: List[Tuple[Callable[[], None], bool]] = []  # one-shot: (callback, patient), told when the
        # first config or error comes (patient ones: config), or the channel closes
        self._clusters: Dict[str, _Cluster] = {}  # by name (kept while the channel lives)
        self._retired: List[_Cluster] = []  # clusters since changed, each closed once its last call has ended
        self._closing: Set[Any] = set()  # (aio) the closes of retired clusters under way, which close() awaits
        self._failover = threading.RLock()  # (re-entered: giving addresses tells the watchers, _fail_over one)
        self._policies: Dict[RouteRetryPolicy, RetryPolicy] = {}  # A44: those of the config's routes, mapped
        self._hashes: Set[RequestHash] = set()  # the hash policies of the config's routes
        self._faults: Set[Tuple[Fault, ...]] = set()  # the faults its calls may run, per route and cluster
        self.channel_id = random.getrandbits(64)  # A42's channel-id hash policy hashes to this
        self._replacements = Replacements()  # the clusters whose LB policy round_robin serves, told of once
        self.generation = 0  # bumped with each config applied: what was made for the previous one may be stale
        self._watchers: List[Callable[[], None]] = []  # connectivity subscribers, on every cluster's subchannels
        self._connect = False  # try_to_connect was asked: each cluster's subchannels connect as they come
        self.outliers = None  # (each cluster has its own detector)
        self.closed = False
        post = where()  # (asked once the bootstrap is known good: a bad one is the error to raise)
        self._aside = post if aside is None else aside
        self._node = bootstrap.node.id
        self._client = XdsClient.acquire(bootstrap.servers(parts.netloc or None)[0], bootstrap.node,
                                         bootstrap.certificate_providers)
        self._watcher = ConfigWatcher(self._client, listener, name, lambda config: post(lambda: self._apply(config)),
                                      lambda error: post(lambda: self._fail(error)),
                                      lambda error: post(lambda: self._fail(NO_LISTENER.format(error, self._node),
                                                                            True)))

    # -- per call -----------------------------------------------------------------------------------------------

    def route(self, method: str, metadata: Optional[Sequence[Tuple[str, Any]]],
              patient: bool = False
              ) -> Optional[Tuple[Any, Any, ClusterImpl, Optional[float], Tuple[Optional[RequestHash], Any]]]:
        """A new call's cluster (its Subchannels), retry policy (None: the channel's service config applies), the
        cluster's admission (the caller admits the call), the longest the call may last (A31: the route's
        max_stream_duration, else its Listener's; None: no limit) and what else its call runs by (the route's hash
        policies, A42, and its fault filters' configs, A33: faults()); None while
        the channel has had neither a config nor an error (or no config, for a `patient` call: one that waits
        for ready). RouteError: the call cannot be sent."""
        config = self._config
        if config is None:
            if self._error is not None and not patient:
                raise RouteError(self._error)
            return None
        headers: Dict[str, str] = {}
        for key, value in metadata or ():
            if isinstance(value, str):  # A28: a header's values joined with ","
                headers[key] = f"{headers[key]},{value}" if key in headers else value
        route = config.virtual_host.route(method, headers)
        if route is None:
            raise RouteError(NO_ROUTE)
        cluster = route.pick_cluster()
        if cluster is None:
            raise RouteError(NO_ACTION)
        entry = self._clusters.get(cluster)
        if entry is None or cluster not in config.clusters:
            raise RouteError(NO_CLUSTER.format(cluster, self._node))
        policy = config.virtual_host.retry_policy_of(route)
        limit = route.max_stream_duration
        if limit is None:
            limit = config.listener.max_stream_duration
        faults = config.virtual_host.faults_of(route, cluster, config.listener.faults)
        return (entry.subchannels, None if policy is None else self._mapped(policy), entry.admission, limit or None,
                (route.request_hash, faults))

    @staticmethod
    def faults(faults: Sequence[Fault], metadata: Optional[Sequence[Tuple[str, Any]]]) -> Tuple[float, int]:
        """A call's faults (A33): the delay before its first attempt, and the status it then ends with (0: none)."""
        return decide(faults, metadata)

    def holds(self, subchannels: Any, policy: Optional[RetryPolicy], hashing: Optional[RequestHash] = None,
              faults: Tuple[Fault, ...] = ()) -> bool:
        """Whether the config standing may still send a new call to `subchannels` (its cluster's, not retired)
        under `policy` (one of its routes', mapped; None: the channel's service config), `hashing` and
        `faults`."""
        return (any(entry.subchannels is subchannels for entry in list(self._clusters.values()))
                and (policy is None or policy in list(self._policies.values()))
                and (hashing is None or hashing in self._hashes) and (not faults or faults in self._faults))

    def policies(self) -> List[RetryPolicy]:
        """The retry policies of the config's routes, as mapped so far (A44)."""
        return list(self._policies.values())

    def _mapped(self, policy: RouteRetryPolicy) -> RetryPolicy:
        """A44. RouteError for a policy gRPC's resolver cannot turn into a service config (a zero back-off)."""
        mapped = self._policies.get(policy)
        if mapped is None:
            try:
                mapped = policy.retry_policy(self._options.max_attempts) or NO_RETRIES
            except ValueError as error:
                raise RouteError(f"the route's retry policy: {error}") from None
            self._policies[policy] = mapped
        return mapped

    def wait(self, timeout: Optional[float], patient: bool = False) -> bool:
        """(Sync.) Wait for the first config or error (`patient`: config), or the channel's close; False if
        `timeout` passed first."""
        with self._ready:
            return self._ready.wait_for(lambda: self._has_answer(patient) or self.closed, timeout)

    def when_ready(self, callback: Callable[[], None], patient: bool = False) -> bool:
        """Call `callback` (where configs are applied) once a config or an error (`patient`: a config) comes, or
        the channel closes; False: one has already."""
        with self._lock:
            if not self._has_answer(patient):
                self._waiters.append((callback, patient))
                return True
        return False

    def _has_answer(self, patient: bool) -> bool:
        return self._config is not None or (self._error is not None and not patient)

    # -- what the control plane says ----------------------------------------------------------------------------

    def _apply(self, config: XdsConfig) -> None:
        if self.closed:
            return
        aggregates: List[Tuple[str, _Cluster]] = []
        for name, cluster in config.clusters.items():
            made = (cluster.kind, cluster.dns_target, cluster.outlier_detection, subchannel_policy(cluster.lb_policy),
                    cluster.ring_sizes)
            entry = self._clusters.get(name)
            old = None
            if entry is not None and entry.made != made:
                old, entry = entry, None
            if entry is None:
                entry = self._clusters[name] = _Cluster(self._subchannels(cluster), made)
                entry.subchannels.watch(lambda n=name, e=entry: self._fail_over(n, e))
                for watcher in list(self._watchers):
                    entry.subchannels.watch(watcher)
            if old is not None:
                # Made otherwise: new calls get new subchannels (a call routed to the old ones meanwhile routes
                # again, to these); the old ones' attempts end, then they close.
                old.priorities = None
                old.subchannels.assign([], f"cluster {name!r} was changed")
                self._retire(old)
            self._replacements.note(name, cluster.lb_policy)
            assignment = config.endpoints.get(name)
            entry.admission.breaker.max_requests = cluster.max_requests
            entry.admission.retries.update(cluster.retry_budget)
            entry.admission.drops.categories = () if assignment is None else assignment.drops
            self._report(name, entry, cluster, assignment)
            if cluster.kind == "EDS":
                entry.priorities = priorities(assignment, made[3] == RING_HASH)
                entry.empty = empty(cluster.eds_name or name, assignment)
                self._fail_over(name, entry)
            elif cluster.kind == "AGGREGATE":
                aggregates.append((name, entry))
        for name, entry in aggregates:  # (once each leaf has its entry)
            self._aggregate(name, entry, config, entry.made[3] == RING_HASH)
        named = config.virtual_host.cluster_names()
        for name, entry in list(self._clusters.items()):
            if name in config.clusters:
                continue
            if name in named:  # a route's cluster that does not exist (deleted): its calls fail, it has no endpoints
                entry.priorities, entry.empty = [], ""
                self._fail_over(name, entry)
            else:  # no route names it any more: its calls in flight end, then it closes
                del self._clusters[name]
                entry.priorities = None
                self._retire(entry)
        self._replacements.keep(config.clusters)
        self._tell(config, None)
        # Only the policies of its routes stay mapped; the new generation tells each method to drop what it made
        # for a cluster or a policy gone.
        host = config.virtual_host
        used = {host.retry_policy_of(route) for route in host.routes}
        self._hashes = {route.request_hash for route in host.routes if route.request_hash is not None}
        self._faults = {host.faults_of(route, name, config.listener.faults)
                        for route in host.routes for name, _ in route.clusters}
        for policy in [policy for policy in list(self._policies) if policy not in used]:
            self._policies.pop(policy, None)
        self.generation += 1

    def _report(self, name: str, entry: _Cluster, cluster: Any, assignment: Any) -> None:
        """A cluster whose lrs_server is the management server reports its loads there (load_report.py)."""
        entry.localities = locality_of(assignment)
        if cluster.load_reports and entry.loads is None:
            subchannels = entry.subchannels

            def where(slot: int) -> Any:
                return entry.localities.get(subchannels.addresses[slot]) if slot < len(subchannels.addresses) \
                    else None
            entry.loads = Source(name, cluster.eds_name, subchannels.picker, where, entry.admission.drops)
            subchannels.picker.loads = True
            self._client.reporter().add(entry.loads)
        elif not cluster.load_reports and entry.loads is not None:
            self._unreport(entry)

    def _unreport(self, entry: _Cluster) -> None:
        if entry.loads is not None:
            self._client.reporter().remove(entry.loads)
            entry.subchannels.picker.loads = False
            entry.loads = None

    def _aggregate(self, name: str, entry: _Cluster, config: XdsConfig, weights: bool) -> None:
        """An aggregate cluster's endpoints: its leaves' priorities, leaf after leaf (A37), so that calls fail
        over from one leaf to the next as from one priority to the next; its error, if its graph has one. A
        LOGICAL_DNS leaf is one priority: the addresses its name resolves to (its own subchannels look it up, and
        each answer gives the aggregate its endpoints again)."""
        entry.config = config
        leaves = config.aggregates.get(name)
        if isinstance(leaves, str):
            entry.priorities = None
            entry.subchannels.assign([], leaves)
            return
        found: List[Endpoints] = []
        for leaf in leaves or ():
            if config.clusters[leaf].kind == "EDS":
                found.extend(priorities(config.endpoints.get(leaf), weights))
                continue
            resolver = self._clusters[leaf].subchannels
            if leaf not in entry.leaves:
                entry.leaves.add(leaf)
                resolver.watch(lambda n=name, e=entry: self._resolved(n, e))
                resolver.look_up()
            addresses = resolver.live_addresses
            if addresses:
                found.append(dict.fromkeys(addresses, 1.0))
        entry.priorities = found
        entry.empty = ""
        self._fail_over(name, entry)

    def _resolved(self, name: str, entry: _Cluster) -> None:
        """A LOGICAL_DNS leaf of aggregate `name` changed: the aggregate's endpoints again, if it still stands."""
        with self._failover:
            if self._clusters.get(name) is entry and not self.closed:
                self._aggregate(name, entry, entry.config, entry.made[3] == RING_HASH)

    def _retire(self, entry: _Cluster) -> None:
        """No new call goes to `entry`; its subchannels close once its last call in flight has ended."""
        self._unreport(entry)
        with self._lock:
            self._retired.append(entry)
        entry.admission.retire(lambda: self._close_soon(entry))

    def _close_soon(self, entry: _Cluster) -> None:
        try:
            self._aside(lambda: self._close_retired(entry))
        except RuntimeError:  # the channel is closing (its workers, or its loop, are gone): its close closes it
            pass

    def _close_retired(self, entry: _Cluster) -> None:
        with self._lock:
            if entry not in self._retired:
                return  # (the channel's close has taken it)
            self._retired.remove(entry)
        closing = entry.subchannels.close()
        if inspect.isawaitable(closing):  # aio: its close runs on the channel's loop (here), awaited by close()
            task = asyncio.ensure_future(closing)
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _fail_over(self, name: str, entry: _Cluster) -> None:
        """Give an EDS cluster's subchannels the endpoints of its first priority, and of each next one while every
        subchannel of those before is failing (on each change of theirs, and of the endpoints)."""
        with self._failover:
            if entry.priorities is None or self.closed:
                return
            weights = serving(entry.priorities, entry.subchannels.failing)
            if weights == entry.given:
                return
            entry.given = weights
            entry.subchannels.assign(list(weights), None if weights else entry.empty or
                                     f"cluster {name!r} has no endpoints", weights)

    def _subchannels(self, cluster: Any) -> Any:
        # ring_hash serves the clusters that ask for it, round_robin every other (lb_policy.py tells of those).
        policy = subchannel_policy(cluster.lb_policy)
        config = dataclasses.replace(self._options.service_config, lb_policy=policy,
                                     outlier_detection=cluster.outlier_detection, ring_sizes=cluster.ring_sizes)
        options = dataclasses.replace(self._options, service_config=config, lb_policy=policy)
        if cluster.kind == "LOGICAL_DNS":
            subchannels = self._make(f"dns:///{cluster.dns_target}", options)
        else:  # (its endpoints are assigned: _fail_over)
            subchannels = self._make(Target("assigned", self.authority, 0, self.authority), options)
        subchannels.failing_note = f" (xDS node ID:{self._node})"  # as grpcio's xDS cluster words its failures
        return subchannels

    def _fail(self, error: str, lost: bool = False) -> None:
        """An error: the config standing keeps serving, unless the target has `lost` it (its Listener is gone);
        with no config, calls fail with `error` (those that wait for ready wait for a config)."""
        self._tell(None, error, lost)

    def _tell(self, config: Optional[XdsConfig], error: Optional[str], lost: bool = False) -> None:
        with self._ready:
            if config is not None:
                self._config, self._error = config, None
            elif self._config is None or lost:
                self._config, self._error = None, error
            waiters = [callback for callback, patient in self._waiters if self._has_answer(patient)]
            self._waiters = [(callback, patient) for callback, patient in self._waiters if callback not in waiters]
            self._ready.notify_all()
        _tell_each(waiters)
        if self._connect:
            for subchannels in self.subchannels():
                subchannels.connect()
        for watcher in list(self._watchers):
            watcher()

    # -- the channel's ------------------------------------------------------------------------------------------

    def subchannels(self) -> List[Any]:
        return [entry.subchannels for entry in self._clusters.values()]

    def watch(self, watcher: Callable[[], None], add: bool = True) -> None:
        """A connectivity subscriber, told of every change of any cluster's subchannels (and of the config)."""
        with self._lock:
            if add:
                self._watchers.append(watcher)
            elif watcher in self._watchers:
                self._watchers.remove(watcher)
        for subchannels in self.subchannels():
            subchannels.watch(watcher, add)

    def connect(self) -> None:
        self._connect = True
        for subchannels in self.subchannels():
            subchannels.connect()

    def aggregate_state(self) -> grpc.ChannelConnectivity:
        """As one grpcio channel's: TRANSIENT_FAILURE while the target has no config, only an error; else READY
        if any cluster's subchannel is, CONNECTING if any is, TRANSIENT_FAILURE when every one has failed."""
        if self.closed:
            return grpc.ChannelConnectivity.SHUTDOWN
        if self._config is None and self._error is not None:
            return grpc.ChannelConnectivity.TRANSIENT_FAILURE
        states = [subchannels.aggregate_state() for subchannels in self.subchannels()]
        for state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.CONNECTING):
            if state in states:
                return state
        if states and all(s is grpc.ChannelConnectivity.TRANSIENT_FAILURE for s in states):
            return grpc.ChannelConnectivity.TRANSIENT_FAILURE
        return grpc.ChannelConnectivity.CONNECTING if self._connect else grpc.ChannelConnectivity.IDLE

    def close(self, *grace: Any) -> List[Any]:
        """Stop following the target and close every cluster's subchannels: what each close returned (the aio
        flavor's: coroutines, for the channel to await)."""
        with self._lock:
            if self.closed:
                return []
            self.closed = True
            waiters, self._waiters = self._waiters, []
            retired, self._retired = self._retired, []
            self._ready.notify_all()
        _tell_each([waiter for waiter, _ in waiters])  # (the calls waiting for a config end: closed)
        for entry in list(self._clusters.values()):
            self._unreport(entry)
        self._watcher.close()
        self._client.release()
        return [subchannels.close(*grace) for subchannels in self.subchannels() + [e.subchannels for e in retired]] \
            + list(self._closing)


def _tell_each(waiters: List[Callable[[], None]]) -> None:
    """Tell every call waiting for the config: one that raises (each should end itself instead) stops neither the
    others nor the rest of the update."""
    for waiter in waiters:
        try:
            waiter()
        except Exception:
            log.exception("grpc_retry: a call waiting for the xDS config failed")
