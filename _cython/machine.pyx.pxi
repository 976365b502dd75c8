# The call machine: one logical call's retries, hedges, replay, commit and transparent retries (gRFC A6), for
# both drivers (asyncio and sync). Sans-I/O: events in, each with the current time; actions out, as a list of
# tuples the driver performs in order. It never touches grpcio, threads, asyncio or the clock.
#
# Theory of operation. A call is a set of attempts; a retry policy is the case of at most one live attempt with a
# backoff between them, hedging the case of several live attempts with a delay between their starts. Each
# attempt has a serial number n (every grpcio call, transparent retries included) and a `previous` count (its
# grpc-previous-rpc-attempts: the counted attempts before it; a transparent retry keeps the count of the attempt
# it stands in for). Until the call commits, it keeps every message the application sent (the replay buffer,
# charged to the call's and the channel's budget) so that each new attempt is sent the same stream in order, one
# message at a time. It commits — one attempt carries it from then on, nothing is buffered, the others are
# cancelled — on the first of: response headers or a message on an attempt, a message overflowing the buffer
# (A6: to the live attempt that has sent the most). When an attempt ends, the machine decides from the policy, the
# throttle, pushback (or the server's RetryInfo), the attempt count and the deadline: retry it transparently, start
# the next attempt now or after a delay, wait for the others, or deliver a status. Under a retry policy with a
# perAttemptRecvTimeout, an attempt that has not answered (headers or a message) that long after its start is
# cancelled and counts as a retryable failure: the machine's one timer is also each such attempt's. The picker
# gives each attempt an address the call has not used while one can take it; when none can, the call waits for the
# subchannels to change or fails fast.
#
# States (`state`) and what moves between them:
#
#   IDLE       --start-------------------------------------------> ATTEMPTING | WAITING | DONE
#   ATTEMPTING --status | attempt timer: retry after a delay-----> BACKOFF
#              --status: due, but no address, nothing live--------> WAITING
#              --headers | message | overflow---------------------> COMMITTED
#              --status | attempt timer: deliver | cancel-------> DONE
#   BACKOFF    --timer: the next attempt is due-------------------> ATTEMPTING | WAITING
#              --timer: deadline | overflow | cancel--------------> DONE
#   WAITING    --subchannels: an address can take it--------------> ATTEMPTING
#              --timer: deadline | cancel-------------------------> DONE
#   COMMITTED  --status of the winner: transparent retry----------> COMMITTED (the retry is the winner)
#              --status of the winner | cancel | deadline---------> DONE
#   DONE       nothing: every event but `report` raises MachineError.
#
# In ATTEMPTING a hedging call may also have its timer armed (the next hedge) or wait for an address for a hedge
# that is due. Events that name an attempt (wrote, headers, message, status) are valid only while it is live;
# `timer` only while one is armed, `subchannels_changed` only while waiting. The driver drops what arrives late
# (an attempt the machine cancelled, a timer it disarmed): such an event is a driver bug here, and raises.
#
# The actions it returns and the notes it takes are listed in actions.pyx.pxi; the attempts it keeps, its replay
# buffer, transparent retries, answers and per-attempt timers, and how a call ends, in the files named for them:
# functions of the machine's (`self`, as in its methods), called directly rather than through its vtable.

from libc.math cimport INFINITY


class MachineError(RuntimeError):
    """An event that is impossible in the call's current state (a driver bug)."""


cdef enum:
    IDLE = 0
    ATTEMPTING = 1
    BACKOFF = 2
    WAITING = 3
    COMMITTED = 4
    DONE = 5

STATE_NAMES = ("IDLE", "ATTEMPTING", "BACKOFF", "WAITING", "COMMITTED", "DONE")


cdef class CallMachine:
    """One logical call. See the theory of operation at the top of this file."""

    def __init__(self, CallPolicy policy, RetryThrottle throttle, BufferPool pool, Picker picker,
                 long per_rpc_limit, double deadline, rng, bint enabled=True, bint wait_for_ready=False,
                 bint unary_request=True):
        self.policy = policy
        self.throttle = throttle
        self.pool = pool
        self.picker = picker
        self.rng = rng
        self.per_rpc_limit = per_rpc_limit
        self.deadline = deadline
        self.max_attempts = policy.max_attempts if enabled else 1
        self.hedging = enabled and policy.hedging_delay >= 0 and policy.max_attempts > 1
        self.transparent_enabled = enabled
        # perAttemptRecvTimeout is a retry policy's: hedging has none, nor a call that may not retry
        self.recv_timeout = (policy.recv_timeout if enabled and policy.max_attempts > 1 and not self.hedging
                             else INFINITY)
        self.watched = self.hedging or self.recv_timeout != INFINITY
        self.wait_for_ready = wait_for_ready
        self.unary_request = unary_request
        self.state = IDLE
        self._attempts = []
        self._redos = []
        self.winner = -1
        # A call that may not retry is committed from the start: it buffers nothing.
        self.committed = self.max_attempts <= 1
        self._last = -1
        self.next_at = -INFINITY
        self.timer_at = INFINITY
        self._used = 0
        self._births = picker.births
        self._messages = []
        self._last_start = -INFINITY
        self._heard_at = -1.0

    # -- events ---------------------------------------------------------------------------------------------

    cpdef list start(self, double now, object request=None):
        """The call begins; `request`: the one message of a unary request, sent with every attempt."""
        if self.state != IDLE:
            self._impossible("start")
        self._idle_since = now
        self.state = ATTEMPTING
        if self.fault_delay > 0:  # (A33) the first attempt waits; the deadline runs meanwhile
            self.next_at = now + self.fault_delay
        if self.hedging and self.policy.hedge is not None and self.policy.hedge.extra is not None:
            self.policy.hedge.extra.call_started(now)
        if self.budget is not None:
            self.budget.call_started(now)
        out = []
        if request is not None:
            _buffer(self, <bytes>request, now, out)
            self.half_closed = True
        self._pump(now, out)
        return out

    cpdef list send_message(self, bytes data, double now):
        """The application sent a message (serialized)."""
        if self.state == DONE or self.state == IDLE or self.half_closed or self.unary_request:
            self._impossible("send_message")
        out = []
        _buffer(self, data, now, out)
        if self.state != DONE:
            _write_more(self, out)
        return out

    cpdef list half_close(self, double now):
        """The application sent its last message."""
        if self.state == DONE or self.state == IDLE or self.half_closed or self.unary_request:
            self._impossible("half_close")
        self.half_closed = True
        out = []
        _write_more(self, out)
        return out

    cpdef list wrote(self, int n, double now):
        """Attempt n has written the message it was given."""
        cdef _Attempt a = _live(self, n, "wrote")
        if not a.writing:
            self._impossible("wrote")
        a.writing = False
        a.sent += 1
        if self.winner == n and a.sent > self.base:
            # The winner has sent it: nothing will replay it.
            del self._messages[:a.sent - self.base]
            self.base = a.sent
        out = []
        _write_more(self, out)
        return out

    cpdef list headers(self, int n, double now, bint empty=False):
        """Attempt n received response headers. With metadata they commit the call to it. Empty ones are real
        headers or a Trailers-Only response: they stop the attempt's perAttemptRecvTimeout, and commit the call
        once HEADERS_GRACE of silence has followed them (seen by the timer while other attempts are out, else by
        the attempt's status or the call's next timer), unless its first message commits it before."""
        cdef _Attempt a
        cdef bint timed
        if self._flushes:
            self._flush_told = True
        if not empty:
            out = self._answered(n, "headers", now)
            if self.winner == n and self._heard_at < 0:
                self._heard_at = now
            return out
        a = _live(self, n, "headers")
        out = []
        timed = a.recv_by != INFINITY
        a.recv_by = INFINITY
        if self.winner != n and a.quiet_until == INFINITY:
            a.quiet_until = now + _HEADERS_GRACE
            self._quiet += 1
            timed = timed or self.live > 1
        if timed:
            self._set_timer(self._wake_at(now), out)
        return out

    cpdef list message(self, int n, double now):
        """Attempt n received its first response message: the call commits to it."""
        return self._answered(n, "message", now)

    cpdef list status(self, int n, int code, object details, object trailing_metadata, double now,
                      bint headers=False, bint response=False):
        """Attempt n ended with `code`: its end record. `headers`: its response headers carried metadata;
        `response`: its (unary) response came with its end. Either is an answer, which commits the call to it
        first, as headers() or message() would have: for call shapes that report the answer only with the status.
        An OK ends the call anyway: its answer commits first only under hedging, for adaptive hedging's latency
        sample."""
        cdef _Attempt a = _live(self, n, "status")
        cdef int kind
        cdef bint answered, retryable, stop, throttled = False
        cdef long pushback
        cdef double delay = -1, answered_at = now
        out = []
        a.live = False
        a.writing = False
        self.live -= 1
        if self.picker.loads:
            self.picker.load_ended(a.address, a.born, code == STATUS_OK)
        if a.budgeted:
            _budget_release(self, a)
        self._last = n
        self._timed_out_last = False
        if self.live == 0:
            self._idle_since = now
        if self.winner != n:
            # Its response, or headers with metadata, are an answer. Empty headers alone are not: a Trailers-Only
            # response's are as empty as real ones (grpcio reports headers that come with the status as empty).
            answered = response or headers
            if not answered and a.quiet_until <= now:  # its silence after empty headers lasted: it answered
                _ahead(self)
                answered = True
                answered_at = a.quiet_until - _HEADERS_GRACE
            if answered and (code != STATUS_OK or self.hedging):
                self._answer(n, a, answered_at, out)
        elif self._heard_at >= 0 and now - self._heard_at >= _EARLY_HEADERS:
            _ahead(self)
        if self.notes is not None:
            self.notes.append((NOTE_STATUS, n, code))
        kind = transparent_kind(code, details) if code != STATUS_OK else -1
        if kind == NOT_SENT:  # how a call that fails fast, finding no connection to try, words its status
            self.picker.last_error = details
        if self.picker.counting:  # outlier detection: the backend's result (one that never left us is not)
            if code == STATUS_OK:
                self.picker.record(a.address, a.born, True)
            elif kind != NOT_SENT:
                self.picker.record(a.address, a.born, False)
        if code != STATUS_OK and (self.winner < 0 or self.winner == n):
            if kind >= 0 and _redo(self, a, kind, now):
                if self.notes is not None:
                    self.notes.append((NOTE_TRANSPARENT, n, kind))
                self._pump(now, out)
                return out
        if a.previous > 0 and code != STATUS_OK:
            self.policy.stats.record_failure()
        retryable = code != STATUS_OK and code < 32 and (self.policy.retryable_mask >> code) & 1
        pushback = parse_pushback(trailing_metadata) if code != STATUS_OK else PUSHBACK_NONE
        stop = pushback == PUSHBACK_STOP
        if retryable and pushback == PUSHBACK_NONE and self.winner != n and trailing_metadata:
            delay = parse_retry_info(trailing_metadata)  # the A6 pushback wins over it
        if self.throttle is not None and self.max_attempts > 1:  # calls that may not retry do not count
            if code == STATUS_OK:
                self.throttle.record_success()
            elif retryable or stop:
                throttled = not self.throttle.record_failure()
        if self.winner == n or code == STATUS_OK:
            # The call's attempt ended (or an uncommitted one succeeded: an empty OK stream, say).
            _end(self, out, A_DELIVER, n, R_OK if code == STATUS_OK else
                 (R_COMMITTED if self.max_attempts > 1 else R_FATAL), now)
            return out
        if self.committed:
            self._impossible("status of a loser")
        if not retryable:
            _end(self, out, A_DELIVER, n, R_FATAL, now)
            return out
        if delay >= 0 and not throttled and self.counted < self.max_attempts:
            if self.notes is not None:
                self.notes.append((NOTE_SERVER_DELAY, n, delay, _honours(self, delay, now)))
            if _honours(self, delay, now):
                self.policy.stats.record_server_delay()
                pushback = <long>(delay * 1000.0 + 0.5)
            else:
                # Past the deadline or the cap: waiting would end the same way, later.
                self._stopped = True
                self._stop_reason = R_SERVER_DELAY
        if stop or throttled:
            self._stopped = True
            self._stop_reason = R_PUSHBACK if stop else R_THROTTLED
            if self.notes is not None:
                self.notes.append((NOTE_STOP, self._stop_reason, self.throttle.tokens if throttled else -1.0))
        elif self.counted < self.max_attempts and not self._stopped:
            if self.hedging:
                # The next hedge comes forward: now, or when the server asks.
                self.next_at = now + pushback / 1000.0 if pushback >= 0 else now
                if self.notes is not None and self.next_at == now:
                    self.notes.append((NOTE_HEDGE_NOW, n))
            elif not _budget_refuses(self, now):
                self.next_at = now + self._backoff(pushback)
            if self.notes is not None and now < self.next_at < INFINITY:
                self.notes.append((NOTE_BACKOFF, n, self.next_at - now, self.counted + 1, self.max_attempts))
        self._pump(now, out)
        return out

    cpdef list timer(self, double now):
        """The timer armed by the last TIMER action fired, or is due still after a FLUSH. A timed call's timer
        (perAttemptRecvTimeout) first asks its driver, while `flush_turns` allow, to FLUSH: to tell the inputs
        that came before it and wait queued (headers, on a busy event loop), then call timer() again. An attempt
        whose headers came by then answered in time, as C-core saw on its own thread: once headers are told the
        timer fires at once, unless what was told re-armed it (then it is not due: nothing happens). The driver
        answers a FLUSH with flushed()."""
        if self.state == DONE:
            self._impossible("timer")
        if self._flushes:
            if self.timer_at > now:  # (inf too) disarmed, or re-armed later, by what was told
                self._flushes = 0
                return []
            if not self._flush_told and self._flushes < self.flush_turns:
                self._flushes += 1
                return [(A_FLUSH,)]
            self._flushes = 0
        elif self.timer_at == INFINITY:
            self._impossible("timer")
        elif self.flush_turns > 0 and self.recv_timeout != INFINITY and self.live > 0:
            self._flushes = 1
            self._flush_told = False
            return [(A_FLUSH,)]
        self.timer_at = INFINITY
        out = []
        if self.recv_timeout != INFINITY and self.live > 0:
            _recv_timers(self, now, out)
            if self.state == DONE:
                return out
        self._pump(now, out)
        return out

    cpdef list flushed(self, double now):
        """The driver told the inputs that were queued when it was asked to FLUSH: the timer again, if it is
        still due and no other turn of it came meanwhile."""
        if not self._flushes:
            return []
        return self.timer(now)

    cpdef list exchange_timer(self, double now, bint headers):
        """The timer, kept by a blocking exchange as its deadline (a sync call's caller), fired with it: the
        exchange ended DEADLINE_EXCEEDED. Headers that came with it were sent ahead of the response: the method's
        HeadersWatch is told (its hedged calls' first attempts show their headers first from then on)."""
        if headers:
            _ahead(self)
        return self.timer(now)

    cpdef list subchannels_changed(self, double now):
        """The subchannels changed after the generation of the last WAIT."""
        if self.state == DONE or not self.waiting:
            self._impossible("subchannels_changed")
        self.waiting = False
        cdef _Redo r
        for r in self._redos:
            r.since = -1    # news arrived: a used address may be tried again
        out = []
        self._pump(now, out)
        return out

    cpdef list cancel(self, int code, double now):
        """The call ends locally with `code`: the application cancelled it, the channel closed, a serializer or
        request iterator failed, or (DEADLINE_EXCEEDED) the driver saw the deadline pass before an attempt did."""
        if self.state == DONE:
            self._impossible("cancel")
        out = []
        _end(self, out, A_END, code, R_DEADLINE if code == STATUS_DEADLINE_EXCEEDED else R_CANCELLED, now)
        return out

    # -- what the driver reads ----------------------------------------------------------------------------------

    cpdef list take_notes(self):
        """The notes taken since the last take, handed over in one step: a sync call's events may come on other
        threads while its driver exports (the GIL is not released between the read and the swap)."""
        cdef list notes = self.notes
        if not notes:
            return None
        self.notes = []
        return notes

    cpdef int previous(self, int n):
        """Attempt n's grpc-previous-rpc-attempts (the count the application's trailing metadata carries)."""
        return (<_Attempt>self._attempts[n]).previous

    cpdef bint wants_message(self, int n):
        """Whether attempt n has written everything it was given and waits for the application's next message."""
        cdef _Attempt a
        if self.state == DONE or self.half_closed or n < 0 or n >= len(self._attempts):
            return False
        a = <_Attempt>self._attempts[n]
        return a.live and not a.writing and not a.closing and a.sent == self.total

    @property
    def attempts(self):
        """grpcio calls made (transparent retries included)."""
        return len(self._attempts)

    @property
    def retries(self):
        return 0 if self.hedging or self.counted == 0 else self.counted - 1

    @property
    def hedges(self):
        return self.counted - 1 if self.hedging and self.counted > 0 else 0

    @property
    def reason_name(self):
        return REASONS[self.reason]

    @property
    def state_name(self):
        return STATE_NAMES[self.state]

    def __repr__(self):
        return (f"CallMachine({STATE_NAMES[self.state]}, counted={self.counted}/{self.max_attempts}, "
                f"live={self.live}, winner={self.winner}, buffered={self.buffered}, reason={REASONS[self.reason]})")

    # -- inside ---------------------------------------------------------------------------------------------------

    cdef _impossible(self, str event):
        raise MachineError(f"{event} is impossible in state {STATE_NAMES[self.state]} ({self!r})")

    cdef list _answered(self, int n, str event, double now):
        cdef _Attempt a = _live(self, n, event)
        out = []
        if a.recv_by != INFINITY:
            a.recv_by = INFINITY  # its per-attempt timer stops
            if self.winner == n:
                self._set_timer(self._wake_at(now), out)
        if self.winner != n:
            self._answer(n, a, now, out)
        return out

    cdef void _answer(self, int n, _Attempt a, double now, list out) except *:
        # Attempt n answered first: the call commits to it. Adaptive hedging takes its latency as a sample.
        cdef HedgingControl hedge = self.policy.hedge
        cdef _Attempt other
        cdef int i
        a.recv_by = INFINITY
        if self.hedging and hedge is not None:
            hedge.record(now - a.started, now)
            for i in range(len(self._attempts)):  # the losers took at least this long (censored samples)
                other = <_Attempt>self._attempts[i]
                if other.live and i != n:
                    hedge.record_censored(now - other.started, now)
        self._commit_to(n, out)

    cdef void _commit_pending(self, list out) except *:
        # Committed with no attempt live: the next to start (the original, or a transparent retry) carries it.
        self.committed = True
        _release(self)

    cdef void _commit_to(self, int n, list out) except *:
        cdef int i
        cdef _Attempt a
        self.winner = n
        self._commit_pending(out)
        self._stopped = True
        self.next_at = INFINITY
        # The winner carries the deadline, and its per-attempt timer if it has not answered (an overflow)
        self._set_timer((<_Attempt>self._attempts[n]).recv_by, out)
        del self._redos[:]
        if self.waiting:
            self.waiting = False
            out.append((A_UNWAIT,))
        out.append((A_COMMIT, n))
        if self.notes is not None:
            self.notes.append((NOTE_COMMIT, n, COMMIT_OVERFLOW if self._overflowed else COMMIT_ANSWER))
        for i in range(len(self._attempts)):
            a = <_Attempt>self._attempts[i]
            if a.live and i != n:
                _cancel_attempt(self, i, a, out)
        if self.state != DONE:
            self.state = COMMITTED
        a = <_Attempt>self._attempts[n]
        if a.sent > self.base:
            del self._messages[:a.sent - self.base]
            self.base = a.sent

    cdef double _backoff(self, long pushback) except? -1:
        cdef double cap
        if pushback >= 0:
            self._backoff_step = 0
            return pushback / 1000.0
        cap = self.policy.initial_backoff * self.policy.backoff_multiplier ** self._backoff_step
        if cap > self.policy.max_backoff:
            cap = self.policy.max_backoff
        self._backoff_step += 1
        return self.rng() * cap

    cdef bint _due(self, double now):
        """Whether the next counted attempt may start now."""
        if self._stopped or self.counted >= self.max_attempts or now < self.next_at:
            return False
        if self.committed and (self.winner >= 0 or self.counted > 0):
            return False
        return True

    cdef void _pump(self, double now, list out) except *:
        """Start what is due and can find an address; then end the call, or arm the timer, or wait."""
        cdef _Redo r
        cdef int address, i = 0
        cdef bint blocked = False
        cdef long generation = self.picker.generation  # before looking: no change slips by a WAIT
        if self._quiet and not self.committed:
            _silence_lasted(self, now, out)
        if self.live == 0 and now >= self.deadline:
            _end(self, out, A_END, STATUS_DEADLINE_EXCEEDED, R_DEADLINE, now)
            return
        while i < len(self._redos):
            r = <_Redo>self._redos[i]
            address = _pick(self)
            if address < 0 or (r.since >= 0 and (self._used >> address) & 1 and self.picker.generation == r.since):
                blocked = True
                i += 1
                continue
            del self._redos[i]
            _start_attempt(self, address, r.previous, now, out, TRANSPARENT)
        while not blocked and self._due(now):
            if self.counted == 0 and self.fault_code > 0:  # (A33) aborted after its delay, before any attempt
                _end(self, out, A_END, self.fault_code, R_FAULT, now)
                return
            if self.hedging and self.counted > 0 and self.throttle is not None and not self.throttle.allows_retry():
                # A6: throttled hedges are not sent.
                self._stopped = True
                self._stop_reason = R_THROTTLED
                if self.notes is not None:
                    self.notes.append((NOTE_STOP, R_THROTTLED, self.throttle.tokens))
                break
            if self.hedging and self.counted > 0 and self.policy.hedge is not None and \
                    self.policy.hedge.extra is not None and not self.policy.hedge.extra.try_retry(now):
                # Over the extra-load budget: the call goes on with the attempts it has.
                self._stopped = True
                self._stop_reason = R_BUDGET
                if self.notes is not None:
                    self.notes.append((NOTE_STOP, R_BUDGET, -1.0))
                break
            if self.hedging and self.counted > 0 and _budget_refuses(self, now):
                break  # (a retry's budget is taken as it is decided, its backoff counted in flight)
            address = _pick(self)
            if address < 0:
                blocked = True
                break
            if self.counted > 0:
                self.policy.stats.record_retry(self.counted)
            self.counted += 1
            _start_attempt(self, address, self.counted - 1, now, out,
                           ORIGINAL if self.counted == 1 else (HEDGE if self.hedging else RETRY))
            if self.hedging and self.counted < self.max_attempts and not self.committed:
                self.next_at = now + (self.policy.hedging_delay if self.policy.hedge is None else
                                      self.policy.hedge.delay(now))
            else:
                self.next_at = INFINITY
        if self.live == 0:
            if blocked:
                if not self.wait_for_ready and self.picker.resolved:
                    # Fail fast, as grpcio does when its channel is in TRANSIENT_FAILURE.
                    if _has_last(self):
                        _end_last(self, out, R_NO_ADDRESS, now)
                    else:
                        _end(self, out, A_END, STATUS_UNAVAILABLE, R_NO_ADDRESS, now)
                    return
            elif not self._redos and not self._may_start_later():
                if not _has_last(self):
                    self._impossible("an end with no attempt")
                _end_last(self, out, _exhausted_reason(self, now), now)
                return
        if blocked and not self.waiting:
            self.waiting = True
            out.append((A_WAIT, generation))
        elif not blocked and self.waiting:
            self.waiting = False
            out.append((A_UNWAIT,))
        self._set_timer(self._wake_at(now), out)
        self._settle_state()

    cdef bint _may_start_later(self):
        return not self._stopped and self.counted < self.max_attempts and self.next_at != INFINITY and not (
            self.committed and (self.winner >= 0 or self.counted > 0))

    cdef double _wake_at(self, double now):
        # A due attempt that found no address waits for the subchannels, not for the timer.
        cdef double at = self.next_at if self.next_at > now and self._may_start_later() else INFINITY
        cdef _Attempt a
        if self.live == 0 and self.deadline < at:
            at = self.deadline
        elif self.recv_timeout != INFINITY:
            for a in self._attempts:
                if a.live and a.recv_by < at:
                    at = a.recv_by
        if self._quiet and self.live > 1 and not self.committed:
            # An attempt out alone needs no timer for its silence: the next timer or its status sees it.
            for a in self._attempts:
                if a.live and a.quiet_until < at:
                    at = a.quiet_until
        return at

    cdef void _set_timer(self, double at, list out) except *:
        if at != self.timer_at:
            self.timer_at = at
            out.append((A_TIMER, at))

    cdef void _settle_state(self):
        if self.state == DONE:
            return
        if self.committed:
            self.state = COMMITTED
        elif self.live > 0:
            self.state = ATTEMPTING
        elif self.waiting:
            self.state = WAITING
        else:
            self.state = BACKOFF

