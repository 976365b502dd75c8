"""Outlier detection, gRFC A50: every `interval`, look at each backend's attempt results since the last look
(the compiled picker counts them per slot, from every attempt the call machine sees end, retries and hedges
included) and eject the outliers — by success rate against the others, or by failure percentage against a
threshold — for `baseEjectionTime` × the number of times in a row they were ejected (at most
`maxEjectionTime`), never more than `maxEjectionPercent` of the backends at once.

Here a backend is a subchannel: with `grpc_retry.connections_per_address` > 1 each connection is judged alone,
for behind one address (an L4 balancer) each may reach another backend. Such a connection is closed when it is
ejected and opened anew when it returns, so it lands wherever the balancer sends it then.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

from grpc_retry._config import OutlierDetection

if TYPE_CHECKING:
    from grpc_retry._backends.subchannels import Subchannels

log = logging.getLogger("grpc_retry")

SHUTDOWN = 4


@dataclass(frozen=True)
class OutlierStats:
    """Outlier detection on one channel since it was made (gRFC A91's counters), and who is ejected now."""

    ejections_enforced_total: int
    ejections_overflow: int             # detected, but not ejected: maxEjectionPercent was reached
    ejections_enforced_success_rate: int
    ejections_detected_success_rate: int
    ejections_enforced_failure_percentage: int
    ejections_detected_failure_percentage: int
    unejections: int
    ejected: Tuple[str, ...]            # the addresses of the subchannels ejected now


class _Backend:
    """A50's per-address entry, here per slot."""

    __slots__ = ("born", "multiplier", "ejected_at")

    def __init__(self, born: int) -> None:
        self.born = born
        self.multiplier = 0
        self.ejected_at: Optional[float] = None


class OutlierDetector:
    COUNTERS = ("ejections_enforced_total", "ejections_overflow", "ejections_enforced_success_rate",
                "ejections_detected_success_rate", "ejections_enforced_failure_percentage",
                "ejections_detected_failure_percentage", "unejections")

    def __init__(self, config: OutlierDetection, subchannels: Subchannels,
                 schedule: Callable[[float, Callable[[], None]], Any],
                 rng: Callable[[], float] = random.random, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._subchannels = subchannels
        self._schedule = schedule
        self._random = rng
        self._clock = clock
        self._backends: Dict[int, _Backend] = {}
        self._timer: Any = None
        self._closed = False
        self.counts = dict.fromkeys(self.COUNTERS, 0)
        self.metric_target = ""  # the grpc.target label of its metrics (_otel.observe_outliers)

    def start(self) -> None:
        """From the channel's first use: count attempts, look every interval."""
        if self.config.counting and self._timer is None and not self._closed:
            self._subchannels.picker.counting = True
            self._subchannels.picker.take_counts()
            self._timer = self._schedule(self.config.interval, _tick(self))

    def close(self) -> None:
        self._closed = True
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def stats(self) -> OutlierStats:
        picker, addresses = self._subchannels.picker, self._subchannels.addresses
        ejected = tuple(addresses[slot] for slot in range(picker.size) if picker.is_ejected(slot))
        return OutlierStats(**self.counts, ejected=ejected)

    def _tick(self) -> None:
        if self._closed:
            return
        try:
            self.sweep()
        except Exception:
            log.exception("grpc_retry: outlier detection sweep failed")
        if not self._closed:
            self._timer = self._schedule(self.config.interval, _tick(self))

    def sweep(self) -> None:
        """One A50 timer run: swap the counts, run both algorithms, age the multipliers, return the due."""
        now = self._clock()
        picker = self._subchannels.picker
        counts = picker.take_counts()
        live: Dict[int, Tuple[int, int]] = {}
        for slot, (ok, failed) in enumerate(counts):
            if picker.state(slot) == SHUTDOWN:
                self._backends.pop(slot, None)
                continue
            backend = self._backends.get(slot)
            if backend is None or backend.born != picker.born(slot):  # a new address in the slot: a new entry
                self._backends[slot] = _Backend(picker.born(slot))
            live[slot] = (ok, failed)
        config = self.config
        if config.success_rate is not None:
            self._success_rate(live, now)
        if config.failure_percentage is not None:
            self._failure_percentage(live, now)
        for slot, backend in self._backends.items():
            if backend.ejected_at is None:
                if backend.multiplier > 0:
                    backend.multiplier -= 1
            elif now >= backend.ejected_at + min(config.base_ejection_time * backend.multiplier,
                                                 max(config.base_ejection_time, config.max_ejection_time)):
                self._uneject(slot, backend)

    def _success_rate(self, live: Dict[int, Tuple[int, int]], now: float) -> None:
        sr = self.config.success_rate
        assert sr is not None
        rates = {slot: ok / (ok + failed) for slot, (ok, failed) in live.items()
                 if ok + failed >= max(sr.request_volume, 1)}
        if len(rates) < sr.minimum_hosts or not rates:
            return
        mean = statistics.fmean(rates.values())
        threshold = mean - statistics.pstdev(rates.values(), mean) * (sr.stdev_factor / 1000)
        for slot, rate in rates.items():
            if rate < threshold:
                self._outlier(slot, live, now, "success_rate", sr.enforcement_percentage)

    def _failure_percentage(self, live: Dict[int, Tuple[int, int]], now: float) -> None:
        fp = self.config.failure_percentage
        assert fp is not None
        if len(live) < fp.minimum_hosts:
            return
        for slot, (ok, failed) in live.items():
            total = ok + failed
            if total >= max(fp.request_volume, 1) and 100 * failed / total > fp.threshold:
                self._outlier(slot, live, now, "failure_percentage", fp.enforcement_percentage)

    def _outlier(self, slot: int, live: Dict[int, Tuple[int, int]], now: float, algorithm: str,
                 enforcement: int) -> None:
        backend = self._backends[slot]
        if backend.ejected_at is not None:
            return
        self.counts[f"ejections_detected_{algorithm}"] += 1
        ejected = sum(1 for b in self._backends.values() if b.ejected_at is not None)
        if 100 * ejected >= self.config.max_ejection_percent * len(live):
            self.counts["ejections_overflow"] += 1
            return
        if self._random() * 100 >= enforcement:
            return
        backend.ejected_at = now
        backend.multiplier += 1
        self.counts[f"ejections_enforced_{algorithm}"] += 1
        self.counts["ejections_enforced_total"] += 1
        ok, failed = live[slot]
        log.debug("outlier detection: %s ejected (%s: %d of %d attempts failed), for %.3g s",
                  self._name(slot), algorithm, failed, ok + failed,
                  min(self.config.base_ejection_time * backend.multiplier,
                      max(self.config.base_ejection_time, self.config.max_ejection_time)))
        self._subchannels.set_ejected(slot, True)

    def _uneject(self, slot: int, backend: _Backend) -> None:
        backend.ejected_at = None
        self.counts["unejections"] += 1
        log.debug("outlier detection: %s back", self._name(slot))
        self._subchannels.set_ejected(slot, False)

    def _name(self, slot: int) -> str:
        subchannels = self._subchannels
        suffix = f" (connection {slot})" if subchannels.connections > 1 else ""
        return f"{subchannels.addresses[slot]}{suffix}"


def _tick(detector: OutlierDetector) -> Callable[[], None]:
    """The sweep timer's callback: it holds the detector weakly, so that a channel dropped without close() is
    not kept alive by its own timer (the sweeps then stop)."""
    ref = weakref.ref(detector)

    def tick() -> None:
        found = ref()
        if found is not None:
            found._tick()

    return tick
