"""A blocking hedged unary call (or one timed by perAttemptRecvTimeout whose attempts show their headers first),
driven on the caller's thread for as long as it has one attempt out.

Most hedged calls never hedge: their first attempt answers before the hedging delay. Such a call needs no
queue of actions, no thread hand-offs and no grpc.Future around it: the caller starts the attempt, polls it (or,
were it reported on grpcio's spin thread, waits for it) and ends the call, as a blocking call does. The machine's
timer (the hedging delay) is the process's timer thread's, in the method's lane (_timer.py). One lock, taken once
per event, is all the call shares. The moment
the call needs more — the timer fires with the attempt out (a hedge), the attempt ends and another must follow,
no subchannel can take it — the call is handed to a non-blocking Call (sync/_nonblocking.py), with the machine, the
attempt out and what the machine has just decided; the caller then waits on that Call, as a blocking call on it
would, and the attempt's later events go to it.
"""

from __future__ import annotations

import threading
from time import monotonic
from typing import TYPE_CHECKING, Any, List, Optional, cast

import grpc

from grpc_retry import _driver as driver
from grpc_retry._core import CANCEL, DELIVER, END, START, TIMER, UNWAIT, WAIT, CallMachine
from grpc_retry._driver import CANCELLED_DETAILS, CLOSED_DETAILS, INF, INTERNAL_DETAILS, log
from grpc_retry._timer import TIMERS
from grpc_retry._transport.ends import sync_response
from grpc_retry._waiters import Waiters
from grpc_retry.sync._attempts import _Attempts
from grpc_retry.sync._call import Call
from grpc_retry.sync._status import FinishedCall, local_error

if TYPE_CHECKING:
    from grpc_retry._core import Action

_OK = grpc.StatusCode.OK
_CANCELLED = grpc.StatusCode.CANCELLED.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
# Once attempt 0 has ended, only another thread's decision can end the call or hand it over: due by the machine's
# timer, if armed, else at once. This long past that with neither, the end was lost (a bug): the call ends.
END_GRACE = 10.0
LOST_END_DETAILS = f"{INTERNAL_DETAILS}: the call's end was lost"


class HedgedBlockingCall(_Attempts):
    """A blocking unary-unary call with a hedging policy (see the module's text): attempt 0 on this thread, or
    the whole call handed to a Call."""

    __slots__ = ("_lock", "_attempt", "_out", "_timer", "_timer_at", "_handed", "_ending", "_ended", "_changed",
                 "_local_details", "_headers_first")

    def __init__(self, method: Any, machine: CallMachine, request: Optional[bytes], metadata: Any, credentials: Any,
                 wait_for_ready: Optional[bool], compression: Any, headers_first: bool = False) -> None:
        self._init_attempts(method, machine, request, metadata, credentials, wait_for_ready, compression, False)
        self._lock = threading.Lock()
        self._attempt: Any = None           # attempt 0, once made
        self._out = False                   # ... and not yet ended
        self._timer: Any = None             # the TIMERS handle of the machine's timer
        self._timer_at = INF                # when the machine's timer is due, as last decided
        self._handed: Optional[Call] = None  # the Call that drives it now
        self._ending = False                # the machine has decided the end
        self._ended = False                 # ... and it is performed: the result is set
        self._changed: Optional[Waiters] = None  # threads waiting for the end or the hand-off
        self._local_details = CANCELLED_DETAILS
        self._headers_first = headers_first  # a timed call (not hedged) whose attempt 0 shows its headers first

    def run(self, with_call: bool) -> Any:
        calls = self._method.calls
        calls.add(self)
        try:
            handed = self._run()
        except Exception:
            if self._ended:  # grpcio refused attempt 0: as grpcio, the call site raises what refused it (_refused)
                raise
            log.exception("grpc_retry: a blocking hedged call failed")
            handed = self._fail(INTERNAL_DETAILS)
        except BaseException:
            self._interrupted()
            raise
        finally:
            calls.discard(self)
        if handed is not None:
            response = handed.polled_result()
        elif self._error is not None:
            raise self._error
        else:
            response = self._response
        if not with_call:
            return response
        # As grpcio's with_call: an ended call (its winning attempt, its trailing metadata extended after hedges)
        final = (self if handed is None else handed)._final
        if not isinstance(final, FinishedCall):
            final = FinishedCall(final, final.trailing_metadata(), response)
        return response, final

    def _run(self) -> Optional[Call]:
        """Attempt 0, to the end of the call or of its own; the Call it was handed to, if it was."""
        actions = self._machine.start(monotonic(), self._request)
        if not _inline(actions, True):
            with self._lock:
                self._hand_over(actions, False)
            return self._handed_over()
        self._timer_at = _timer_at(actions, INF)
        if actions and actions[0][0] == START:
            start = actions[0]
            if not self._first(start[1], start[2], start[3]):
                return None
            actions = actions[1:]
        attempt = self._attempt
        try:
            self._apply(actions, None, True)
        except Exception:  # a bug: the call ends, its attempt cancelled, and polled to its end all the same
            log.exception("grpc_retry could not perform %r", actions)
            self._fail(INTERNAL_DETAILS)
        if attempt is not None and attempt.polled:
            try:
                attempt.poll()
            finally:
                handed = self._handed
                if handed is not None:
                    handed._poll_done()
        if not self._ended:  # (most often it has: the polled attempt's end, performed here)
            with self._lock:  # the end (or the hand-off) may be another thread's, and under way
                lost = self._wait_for_end()
            if lost and attempt is not None:
                attempt.cancel()
        return self._handed

    def _wait_for_end(self) -> bool:
        """(Under the lock; attempt 0 has ended.) Wait for the end or the hand-off, which another thread decides
        and performs. Nothing by END_GRACE past when it is due means the end was lost: the call ends INTERNAL
        rather than block its caller for ever. Whether it did."""
        seen = (self._timer_at, self._ending)
        since = monotonic()
        while not self._ended and self._handed is None:
            now = monotonic()
            if (self._timer_at, self._ending) != seen:  # another thread is at the call: it is due from now
                seen = (self._timer_at, self._ending)
                since = now
            due = (since if self._timer_at == INF else max(since, self._timer_at)) + END_GRACE
            if now >= due:
                log.error("grpc_retry: a blocking hedged call's end was lost; it ends INTERNAL")
                return self._end_internal(LOST_END_DETAILS)
            if self._changed is None:
                self._changed = Waiters(self._lock)
            self._changed.wait(due - now)
        return False

    def _handed_over(self) -> Call:
        """(The thread that handed the call over, outside the lock.) The Call performs what the machine decided."""
        handed = cast(Call, self._handed)
        handed._drain()
        if self._method.closed():
            handed._fail(grpc.StatusCode.CANCELLED, CLOSED_DETAILS)
        return handed

    # -- the machine's actions, when they fit one attempt on this thread --------------------------------------

    def _first(self, n: int, address: int, previous: int) -> bool:
        """Make attempt 0; False if grpcio refused it (the call has then ended, or raises)."""
        method = self._method
        obs = self._obs
        if obs is not None:
            obs.flush()
        self._out = True  # (before it is made: its end may be told on grpcio's thread before this one goes on)
        try:
            first = method.inner(address)
            self._attempt = first.polled(
                self._request, self._timeout(), self._attempt_metadata(n, previous), self._credentials,
                self._grpc_wfr, self._compression, self._on_headers, self._on_end,
                not self._headers_first and method.first_whole())
        except Exception as error:  # the channel closed meanwhile, or grpcio refused the call
            self._refused(error)
            return False
        method.attempt_started(address)
        return True

    def _refused(self, error: Exception) -> None:
        closed = self._method.closed()
        if not closed:
            log.debug("grpc_retry could not start an attempt: %r", error)  # (raised, or in the status details)
        self._local_details = CLOSED_DETAILS if closed else f"grpc_retry could not start an attempt: {error!r}"
        with self._lock:
            self._ending = True
            actions = self._machine.cancel(_CANCELLED if closed else _INTERNAL, monotonic())
        self._apply(actions, None, False)
        if not closed:  # as grpcio, the call site raises what refused the call (metadata it cannot send)
            raise error

    def _apply(self, actions: List[Action], attempt: Any, alone: bool) -> None:
        """Actions _inline() accepted, outside the lock (`attempt`: attempt 0, if it has ended; `alone`: the
        call's start, attempt 0 just made and not yet polled, when no other thread can act on the call)."""
        if self._obs is not None:
            self._obs.flush()
        for action in actions:
            kind = action[0]
            if kind == TIMER:
                self._set_timer(action[1], alone)
            elif kind == CANCEL:
                if self._attempt is not None:
                    self._attempt.cancel()
            elif kind == DELIVER:
                self._outcome(attempt, self._machine.previous(0), sync_response(attempt))
                self._done()
            elif kind == END:
                self._local(action[1], self._local_details)
                self._done()

    def _set_timer(self, at: float, alone: bool) -> None:
        """The machine's timer, due `at`: the timer thread's, in the method's lane, unless a later decision has
        moved it meanwhile (the timer it replaces was cancelled as it was decided: _decided)."""
        if at == INF:
            return
        if alone:  # (no lock: nothing else can touch the timer yet)
            if at == self._timer_at and self._timer is None:
                self._timer = TIMERS.schedule(at - monotonic(), self._due, False, self._method)
            return
        with self._lock:  # (under it: see Call._arm)
            if at == self._timer_at and self._timer is None and not self._ending and self._handed is None:
                self._timer = TIMERS.schedule(at - monotonic(), self._due, False, self._method)

    def _done(self) -> None:
        lock = self._lock
        lock.acquire()  # (not `with`, on the call's path: compiled, a `with` binds two of the lock's methods)
        try:
            timer, self._timer = self._timer, None
            self._ended = True
            if self._changed is not None:
                self._changed.notify_all()
        finally:
            lock.release()
        if timer is not None:
            timer.cancel()

    # -- events: decided under the lock --------------------------------------------------------------------------

    def _on_headers(self, attempt: Any) -> None:
        """Attempt 0's headers (this thread polling it, or grpcio's spin thread), for the machine."""
        lock = self._lock
        lock.acquire()
        try:
            handed = self._handed
            if handed is None:
                if self._ending or not self._out:  # (not out: ended, or cancelled by its perAttemptRecvTimeout)
                    return
                try:
                    decided = self._decided(self._machine.headers(0, monotonic(), not attempt.initial_metadata()),
                                            True)
                except Exception:  # (told on grpcio's thread or the poller's, where it would only be logged)
                    decided = self._broken()
        finally:
            lock.release()
        if handed is not None:
            handed._headers_came(0, attempt)
        else:
            self._after(decided, attempt)

    def _on_end(self, attempt: Any) -> None:
        """Attempt 0 ended: its response commits, then its status goes to the machine."""
        lock = self._lock
        lock.acquire()
        try:
            handed = self._handed
            if handed is None:
                out, self._out = self._out, False
                if self._ending or not out:  # (not out: the machine cancelled it, for its perAttemptRecvTimeout)
                    return
                machine = self._machine
                state = attempt._state  # (its own: sync_status() would copy it)
                code = state.code  # (0 for OK without StatusCode.value, an enum's property: interpreted Python)
                try:
                    # Its headers and response came with its end (one batch: Method.first_whole)
                    decided = self._decided(machine.status(0, 0 if code is _OK else code.value[0], state.details,
                                                           state.trailing_metadata, monotonic(),
                                                           bool(state.initial_metadata), state.response is not None),
                                            False)
                    if machine.headers_ahead:
                        self._method.headers_early()
                except Exception:  # (as in _on_headers)
                    decided = self._broken()
        finally:
            lock.release()
        if handed is not None:
            handed._headers_first_ended(0, attempt)
        else:
            self._after(decided, attempt)

    def _due(self) -> None:
        """The machine's timer (on the timer thread): the next hedge is due (or the deadline), which hands the
        call over, unless attempt 0's silence after empty headers has committed the call."""
        with self._lock:
            now = monotonic()
            if self._ending or self._handed is not None or self._timer_at == INF or now < self._timer_at:
                return  # (a timer superseded as it fired)
            self._timer = None
            self._timer_at = INF
            try:
                actions = self._machine.timer(now)
                if self._machine.headers_ahead:
                    self._method.headers_early()
                decided = self._decided(actions, self._out)
            except Exception:  # (on the timer thread, which would only log it)
                decided = self._broken()
        self._after(decided, None)

    def _after(self, decided: Optional[List[Action]], attempt: Any) -> None:
        """(Outside the lock.) Perform what an event decided here, or, if it handed the call over, let the Call
        perform it."""
        try:
            if decided is None:
                self._handed_over()
            elif decided:
                self._apply(decided, attempt, False)
        except Exception:  # a bug, on a thread that would only log it: the call ends rather than never
            log.exception("grpc_retry could not perform %r", decided)
            self._fail(INTERNAL_DETAILS)

    def _decided(self, actions: List[Action], live: bool) -> Optional[List[Action]]:
        """(Under the lock.) What the machine decided: the actions to perform here, or None when they need the
        Call, to which the call is handed (`live`: attempt 0 is still out)."""
        if self._headers_first and self._out and (CANCEL, 0) in actions:
            self._out = live = False  # attempt 0 is over for the machine (its perAttemptRecvTimeout: timed calls')
        if not _inline(actions, False):
            self._hand_over(actions, live)
            return None
        at = _timer_at(actions, self._timer_at)
        if at != self._timer_at:  # the timer armed for the old time is dropped now; _set_timer() sets the new one
            self._timer_at = at
            timer, self._timer = self._timer, None
            if timer is not None:
                timer.cancel()
        if actions and actions[-1][0] in (DELIVER, END):
            self._ending = True
        return actions

    def _broken(self) -> List[Action]:
        """(Under the lock, in an exception handler.) The machine failed deciding an event (a bug): what ends the
        call INTERNAL, as the non-blocking driver's _event() does."""
        self._local_details = INTERNAL_DETAILS
        self._ending = True
        return driver.broken([0] if self._out else [])

    def _fail(self, details: str) -> Optional[Call]:
        """(Outside the lock.) A bug met performing the call: it ends INTERNAL with `details`, once, however far
        it had got; a Call it was handed to ends so. That Call, if it was."""
        with self._lock:
            handed = self._handed
            ended = handed is None and self._end_internal(details)
        if handed is not None:
            handed._fail(grpc.StatusCode.INTERNAL, details)
        elif ended and self._attempt is not None:
            self._attempt.cancel()
        return handed

    def _end_internal(self, details: str) -> bool:
        """(Under the lock.) The call ends INTERNAL with `details`, without the machine, whose state is in doubt,
        unless it has ended or been handed over: whether it did. Attempt 0 is the caller's to cancel."""
        if self._ended or self._handed is not None:
            return False
        self._ending = self._ended = True
        self._timer_at = INF
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()  # (takes no lock: as in _hand_over)
        self._error = local_error(grpc.StatusCode.INTERNAL, details)
        if self._changed is not None:
            self._changed.notify_all()
        return True

    def _hand_over(self, actions: List[Action], live: bool) -> None:
        """(Under the lock.) The call goes on as a Call, which takes the machine, attempt 0 (if `live`), the
        timer armed, and performs `actions`; threads waiting here go on with it."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        attempt = self._attempt if live else None
        self._handed = Call.adopting(self, actions, attempt, self._timer_at)
        if self._changed is not None:
            self._changed.notify_all()

    def _interrupted(self) -> None:
        """The caller's wait was interrupted (a signal's exception): the call ends CANCELLED (grpcio's blocking
        call drops its own), and the exception goes on."""
        with self._lock:
            handed = self._handed
            actions: List[Action] = []
            if handed is None and not self._ending:
                self._ending = True
                actions = self._machine.cancel(_CANCELLED, monotonic())
        if handed is not None:
            handed._abandon()
        else:
            self._apply(actions, None, False)

    # -- the channel's close ------------------------------------------------------------------------------------

    def close_channel(self) -> None:
        """Attempt 0 ends with its subchannel's close, as a blocking grpcio call does; a Call handed the call
        is closed as the channel's other calls are."""
        handed = self._handed
        if handed is not None:
            handed.close_channel()

    def closed(self, timeout: float) -> None:
        deadline = monotonic() + timeout
        with self._lock:
            while not self._ended and self._handed is None:
                left = deadline - monotonic()
                if left <= 0:
                    return
                if self._changed is None:
                    self._changed = Waiters(self._lock)
                self._changed.wait(left)
            handed = self._handed
        if handed is not None:
            handed.closed(max(0.0, deadline - monotonic()))


def _inline(actions: List[Action], starting: bool) -> bool:
    """Whether one attempt on the caller's thread can perform `actions`: no attempt but the first, started with
    the call; no wait for a subchannel."""
    for index, action in enumerate(actions):
        kind = action[0]
        if kind == START:
            if not starting or index != 0:
                return False
        elif kind == WAIT or kind == UNWAIT:
            return False
    return True


def _timer_at(actions: List[Action], at: float) -> float:
    """When the machine's timer is due after `actions` (`at` before them)."""
    for action in actions:
        if action[0] == TIMER:
            at = action[1]
    return at
