# Load-balancing pickers that avoid the backends a call already used (A6 "Where Retries Occur": retries sit
# above the picker "so that every retry gets a chance to be sent out on a different subchannel").
#
# Subchannels sit in slots 0..n-1; a call's used slots are a bit mask (a Python int, any size). A slot whose
# address vanished is SHUTDOWN and may later be given to another address: it is then reborn (`born[i]` takes the
# next value of `births`), and `forget()` clears from a call's mask the slots reborn since the call last looked,
# so that a call never avoids a new backend because an old one sat in its slot. A pick
# prefers, in order: an unused READY address, an unused address that can connect (IDLE or CONNECTING), and
# only when every address is used or down, the normal pick (READY, then connectable). -1: nothing to pick
# (every address in TRANSIENT_FAILURE or shut down): the call waits (wait_for_ready) or fails.
#
# The picker is the call machine's view of the channel's subchannels: besides the states it keeps `generation`,
# bumped on every change, so that a call that found nothing to pick can wait for "a change after generation g"
# without missing one that happened while it looked; and `resolved`, whether the target has resolved (to
# addresses or to an error), which decides between failing fast and waiting; and `last_error`, the details of
# the last attempt that found no connection, which a call failing fast without one words its status with.
#
# Weights (an xDS cluster's localities): a schedule of slots, each as often as its weight, gives where each
# round_robin rotation starts; the rules above still choose from there.
#
# ring_hash (A42, ring.pyx.pxi): the call's request hash gives where on the ring the walk starts; the first slot
# on the walk that is neither used by the call, failing nor ejected takes the attempt — so a call's first attempt
# goes where gRPC's ring_hash sends it (the first entry not in TRANSIENT_FAILURE; an IDLE one connects), and each
# retry or hedge to the next endpoint on the ring the call has not used. With none unused: the first used one that
# can take it, then an ejected one.
#
# Load reports (LRS, _backends/xds/load_report.py) count each slot's attempts here while `loads`: issued, in
# progress, succeeded and failed (`load_started` / `load_ended`, read and reset by `take_loads`).
#
# Outlier detection (gRFC A50, _backends/outliers.py) counts each attempt's result for its slot here (`record`,
# only while `counting`) and marks slots ejected. An ejected slot gets no attempt while any other slot could take
# one, used by the call or not; only when nothing else is left does a call go there rather than fail.

cdef enum:
    STATE_IDLE = 0
    STATE_CONNECTING = 1
    STATE_READY = 2
    STATE_TRANSIENT_FAILURE = 3
    STATE_SHUTDOWN = 4

PICK_FIRST = 0
ROUND_ROBIN = 1
RING_HASH = 2


cdef class Picker:
    def __init__(self, int policy, int size):
        if policy not in (PICK_FIRST, ROUND_ROBIN, RING_HASH):
            raise ValueError(f"unknown picker policy {policy}")
        self.policy = policy
        self._states = [STATE_IDLE] * size
        self._born = [0] * size
        self.births = 0
        self._next = 0
        self._ejected = [False] * size
        self.ejected_count = 0
        self.counting = False
        self.last_error = None
        self._ok = [0] * size
        self._failed = [0] * size
        self._schedule = None
        self._turn = 0
        self.ring = None
        self.loads = False
        self._loads = [[0, 0, 0, 0] for _ in range(size)]  # per slot: issued, in progress, succeeded, failed

    def set_schedule(self, schedule):
        """round_robin by weight: the slots rotations start at, in turn (None, or empty: every slot in order)."""
        self._schedule = list(schedule) if schedule else None
        self._turn = 0

    @property
    def size(self):
        return len(self._states)

    def states(self):
        return list(self._states)

    def resize(self, int size):
        """New resolution: addresses keep their slot; new slots start IDLE."""
        cdef int grow = size - len(self._states)
        if grow < 0:
            for i in range(size, len(self._states)):
                self.eject(i, False)
            for per_slot in (self._states, self._born, self._ejected, self._ok, self._failed, self._loads):
                del per_slot[size:]
        else:
            self._states.extend([STATE_IDLE] * grow)
            self._born.extend([0] * grow)
            self._ejected.extend([False] * grow)
            self._ok.extend([0] * grow)
            self._failed.extend([0] * grow)
            self._loads.extend([[0, 0, 0, 0] for _ in range(grow)])
        if self._next >= size:
            self._next = 0

    def reborn(self, int index):
        """Slot `index` now holds another address (IDLE): calls that used the old one may use it."""
        self.births += 1
        self._born[index] = self.births
        self._states[index] = STATE_IDLE
        self.eject(index, False)
        self._ok[index] = self._failed[index] = 0
        self._loads[index] = [0, 0, 0, 0]

    cpdef long born(self, int index):
        return self._born[index]

    def eject(self, int index, bint ejected):
        """Outlier detection ejects slot `index` (or returns it)."""
        if self._ejected[index] != ejected:
            self._ejected[index] = ejected
            self.ejected_count += 1 if ejected else -1

    def is_ejected(self, int index):
        return self._ejected[index]

    cdef void record(self, int index, long born, bint ok):
        """An attempt on slot `index` (when it held the address born `born`) ended: ok, or failed."""
        if self._born[index] == born:
            if ok:
                self._ok[index] += 1
            else:
                self._failed[index] += 1

    cdef void load_started(self, int index):
        cdef list load = self._loads[index]
        load[0] += 1
        load[1] += 1

    cdef void load_ended(self, int index, long born, bint ok):
        cdef list load
        if self._born[index] == born:  # (an attempt on the address the slot held before: its load went with it)
            load = self._loads[index]
            load[1] -= 1
            load[2 if ok else 3] += 1

    def take_loads(self):
        """Per slot, (issued, in progress, succeeded, failed): the attempts issued and ended since the last time
        (their counts start again from zero), and those in progress now."""
        taken = [tuple(load) for load in self._loads]
        for load in self._loads:
            load[0] = load[2] = load[3] = 0
        return taken

    def take_counts(self):
        """Per slot, (succeeded, failed) since the last time; the counts start again from zero."""
        counts = list(zip(self._ok, self._failed))
        n = len(self._ok)
        self._ok = [0] * n
        self._failed = [0] * n
        return counts

    cpdef object forget(self, object used, long since):
        """`used` without the slots reborn after births was `since`."""
        cdef int i
        for i in range(len(self._born)):
            if self._born[i] > since and (used >> i) & 1:
                used ^= 1 << i
        return used

    cpdef void set_state(self, int index, int state):
        if 0 <= index < len(self._states):
            self._states[index] = state

    cpdef int state(self, int index):
        return self._states[index]

    cpdef bint all_failed(self):
        cdef object s
        for s in self._states:
            if s != STATE_TRANSIENT_FAILURE and s != STATE_SHUTDOWN:
                return False
        return True

    cpdef int pick(self, object used, unsigned long long request_hash=0):
        """An address index for the next attempt of a call that used the addresses in mask `used` (and whose
        request hash, under ring_hash, is `request_hash`)."""
        cdef int n = len(self._states)
        cdef int start, i, k, s, ready_used = -1, connectable_used = -1, connectable_unused = -1, ejected = -1
        cdef bint is_used
        if n == 0:
            return -1
        if self.policy == RING_HASH:
            return self._ring_pick(used, request_hash)
        start = self._next if self.policy == ROUND_ROBIN else 0
        if self._schedule is not None:
            start = self._schedule[self._turn]
            if start >= n:
                start = 0
        for k in range(n):
            i = (start + k) % n
            s = self._states[i]
            is_used = used is not None and (used >> i) & 1
            if self.ejected_count and self._ejected[i]:
                if s == STATE_READY or s == STATE_IDLE or s == STATE_CONNECTING:
                    # The last resort: an unused READY one, else the first that can take an attempt.
                    if ejected < 0 or (s == STATE_READY and not is_used and
                                       (self._states[ejected] != STATE_READY or (used >> ejected) & 1)):
                        ejected = i
                continue
            if s == STATE_READY:
                if not is_used:
                    return self._picked(i, n)
                if ready_used < 0:
                    ready_used = i
            elif s == STATE_IDLE or s == STATE_CONNECTING:
                if not is_used:
                    if connectable_unused < 0:
                        connectable_unused = i
                elif connectable_used < 0:
                    connectable_used = i
        if connectable_unused >= 0:
            return self._picked(connectable_unused, n)
        if ready_used >= 0:
            return self._picked(ready_used, n)
        if connectable_used >= 0:
            return self._picked(connectable_used, n)
        if ejected >= 0:
            return self._picked(ejected, n)
        return -1

    cdef int _ring_pick(self, object used, unsigned long long request_hash):
        cdef Ring ring = self.ring
        cdef int n = len(self._states), first, k, i, s, used_one = -1, ejected = -1
        if ring is None or ring.size == 0:
            return -1
        first = ring.first(request_hash)
        for k in range(ring.size):
            i = ring.slot_at((first + k) % ring.size)
            if i >= n:
                continue
            s = self._states[i]
            if s != STATE_READY and s != STATE_IDLE and s != STATE_CONNECTING:
                continue
            if self.ejected_count and self._ejected[i]:
                if ejected < 0:
                    ejected = i
            elif used is not None and (used >> i) & 1:
                if used_one < 0:
                    used_one = i
            else:
                return i
        return used_one if used_one >= 0 else ejected

    cdef int _picked(self, int i, int n):
        if self.policy == ROUND_ROBIN:
            if self._schedule is not None:
                self._turn = (self._turn + 1) % len(self._schedule)
            else:
                self._next = (i + 1) % n
        return i
