# The compiled core's classes: their fields and C methods (the code is in _cython/*.pyx.pxi, included by
# _cython/_core.pyx, which is compiled as this module). The drivers cimport CallMachine: each step of a call
# (start, headers, status, ...) is then a C call through its vtable, and its fields struct reads, not a
# lookup by name and a Python call with its numbers boxed.

cdef enum:
    N_BUCKETS = 96             # adaptive hedging's latency histograms (hedging.pyx.pxi)
    GAP = 3                    # buckets (a factor of ~1.6) without an answer: a gap


cdef class BufferPool:
    cdef readonly long capacity
    cdef readonly long used
    cdef bint reserve(self, long nbytes)
    cdef void release(self, long nbytes)


cdef class RetryThrottle:
    cdef readonly long max_milli_tokens
    cdef readonly long milli_token_ratio
    cdef readonly long milli_tokens
    cpdef bint record_failure(self)
    cpdef void record_success(self)
    cpdef bint allows_retry(self)


cdef class _Window:
    cdef double width
    cdef long long slot
    cdef long counts[10]
    cdef long total
    cdef void roll(self, double now)
    cdef void add(self)


cdef class RetryBudget:
    cdef readonly bint concurrent
    cdef readonly double percent, interval, min_interval
    cdef readonly long min_count, max_in_flight
    cdef _Window _calls, _retries, _floor
    cdef readonly long calls_in_flight, retries_in_flight
    cdef readonly long refused     # retries and hedges it did not allow
    cdef readonly long credit      # (rate form) retries it still allows beyond the share
    cpdef void call_started(self, double now)
    cpdef void call_ended(self)
    cpdef bint try_retry(self, double now)
    cpdef void retry_ended(self)


cdef class HeadersWatch:
    cdef readonly long first, every      # its first calls show their headers first, then one in every `every`
    cdef readonly long calls             # hedged calls started
    cdef public bint early               # its server was seen sending response headers ahead of a response
    cpdef bint first_whole(self)


cdef class HedgingControl:
    cdef readonly double quantile        # 0: the delay is the config's
    cdef readonly double floor           # the config's hedgingDelay
    cdef readonly double max_extra_load  # < 0: no budget
    cdef readonly RetryBudget extra      # max_extra_load as a rate budget (None: no cap)
    cdef double _answered[N_BUCKETS]     # attempts that answered, by latency
    cdef double _censored[N_BUCKETS]     # attempts cancelled for another's answer, by age
    cdef double _total
    cdef double _weight                  # a sample recorded now weighs this (older ones weigh what they did)
    cdef double _last                    # when the last sample came
    cpdef void record(self, double latency, double now)
    cpdef void record_censored(self, double age, double now)
    cdef double _weigh(self, double now)
    cpdef double estimate(self, double now)
    cpdef double delay(self, double now)


cdef class RetryStats:
    cdef readonly long retries          # A6: attempts after a call's first counted one (retries and hedges)
    cdef readonly long retries_failed
    cdef long _buckets[8]
    # per call, counted when it ends
    cdef readonly long calls
    cdef readonly long attempts         # grpcio calls made, transparent retries included
    cdef readonly long transparent_retries
    cdef readonly long committed_by_overflow
    cdef readonly long stopped_by_throttling
    cdef readonly long stopped_by_pushback
    cdef readonly long stopped_by_attempt_limit
    cdef readonly long attempts_timed_out   # attempts cancelled by perAttemptRecvTimeout
    cdef readonly long server_delays        # retries delayed as a server's RetryInfo asked
    cdef readonly long refused_by_budget    # calls whose retry or hedge the retry budget did not allow
    cdef void record_call(self, long attempts, long transparent, bint overflowed, int reason)
    cdef void record_retry(self, int n)
    cdef void record_failure(self)
    cdef void record_recv_timeout(self)
    cdef void record_server_delay(self)
    cdef void record_budget_refusal(self)


cdef class CallPolicy:
    cdef readonly int max_attempts
    cdef readonly double initial_backoff
    cdef readonly double max_backoff
    cdef readonly double backoff_multiplier
    cdef readonly unsigned int retryable_mask
    cdef readonly double timeout
    cdef readonly object wait_for_ready
    cdef readonly double hedging_delay   # seconds; -1: a retry policy (or none)
    cdef readonly HedgingControl hedge   # adaptive delay and extra-load budget (None: A6's fixed delay)
    cdef readonly double recv_timeout    # perAttemptRecvTimeout, seconds (inf: none)
    cdef readonly double max_server_delay  # seconds: a longer RetryInfo delay ends the call
    cdef readonly RetryStats stats


cdef struct _Entry:
    unsigned long long hash
    int slot


cdef class Ring:
    cdef _Entry *_entries
    cdef readonly int size
    cdef int first(self, unsigned long long h)
    cdef int slot_at(self, int i)


cdef class Picker:
    cdef readonly int policy
    cdef public Ring ring        # ring_hash: the ring (None: none yet, or another policy)
    cdef public bint loads       # load reports want every attempt's start and end
    cdef list _loads             # per slot: [issued, in progress, succeeded, failed]
    cdef list _states
    cdef int _next          # round_robin: where the next rotation starts
    cdef public long generation  # bumped by the subchannels on every change
    cdef public bint resolved    # the target resolved (to addresses, or to an error)
    cdef list _born              # per slot: the value of `births` when it last took an address
    cdef readonly long births    # bumped each time a slot is given (again) to an address
    cdef list _ejected           # per slot: ejected by outlier detection
    cdef readonly int ejected_count
    cdef public bint counting    # outlier detection wants every attempt's result
    cdef public object last_error  # the details of the last attempt that found no connection (or None)
    cdef list _ok                # per slot: attempts that succeeded since take_counts()
    cdef list _failed            # ... and that failed
    cdef list _schedule          # round_robin by weight: the slots each rotation starts at, in turn (None: even)
    cdef int _turn               # ... and where in it the next starts
    cpdef long born(self, int index)
    cdef void record(self, int index, long born, bint ok)
    cdef void load_started(self, int index)
    cdef void load_ended(self, int index, long born, bint ok)
    cpdef object forget(self, object used, long since)
    cpdef void set_state(self, int index, int state)
    cpdef int state(self, int index)
    cpdef bint all_failed(self)
    cpdef int pick(self, object used, unsigned long long request_hash=*)
    cdef int _ring_pick(self, object used, unsigned long long request_hash)
    cdef int _picked(self, int i, int n)


cdef class _Attempt:
    cdef int previous       # its grpc-previous-rpc-attempts
    cdef long generation    # the picker's generation when it started
    cdef int address        # its slot
    cdef long born          # ... and which address the slot held (picker.born)
    cdef double started     # when
    cdef double recv_by     # its perAttemptRecvTimeout is due then (inf: none, or it has answered)
    cdef double quiet_until  # its empty headers' silence commits the call then (inf: none came)
    cdef long sent          # messages it has written
    cdef bint live
    cdef bint budgeted      # a retry or hedge the retry budget counts in flight until it ends
    cdef bint writing       # a WRITE is out, not yet answered by wrote()
    cdef bint closing       # HALF_CLOSE is out


cdef class _Redo:
    cdef int previous
    cdef long since         # NOT_SENT: reuse a used address only after a change past this generation (-1: any)


cdef class CallMachine:
    # settings
    cdef readonly CallPolicy policy
    cdef RetryThrottle throttle
    cdef BufferPool pool
    cdef Picker picker
    cdef object rng
    cdef long per_rpc_limit
    cdef readonly double deadline
    cdef readonly int max_attempts
    cdef readonly bint hedging
    cdef readonly bint transparent_enabled
    cdef readonly double recv_timeout  # perAttemptRecvTimeout (inf: none)
    cdef readonly bint watched  # hedged, or timed per attempt: each attempt's first answer matters as it comes
    cdef bint wait_for_ready
    cdef bint unary_request
    # state
    cdef readonly int state
    cdef list _attempts         # by serial number
    cdef list _redos
    cdef readonly int live
    cdef readonly int counted   # attempts that count toward maxAttempts
    cdef readonly int winner    # the committed attempt (-1: none, or the next to start)
    cdef readonly bint committed
    cdef int _last              # the attempt whose status arrived last (-1: none)
    cdef readonly double next_at   # when the next counted attempt is due (inf: none planned)
    cdef readonly double timer_at  # the armed timer (inf: none)
    cdef readonly bint waiting     # a WAIT is out
    cdef bint _stopped          # no further counted attempts (pushback "stop", throttled)
    cdef int _stop_reason
    cdef int _backoff_step
    cdef bint _refused_retried
    cdef object _used           # bit mask of the slots (subchannels) this call's attempts went to
    cdef long _births           # the picker's births when _used was last brought up to date
    # the replay buffer: messages[k - base] is message k; `buffered` bytes are charged to the budgets
    cdef list _messages
    cdef readonly long base
    cdef readonly long total    # messages the application sent
    cdef readonly long buffered
    cdef readonly bint half_closed
    # the report
    cdef readonly int transparent_retries
    cdef readonly int recv_timeouts  # attempts cancelled by their perAttemptRecvTimeout
    cdef readonly bint recv_timeout_ended  # the call ENDed as its last attempt's per-attempt timer fired
    cdef bint _timed_out_last   # the last attempt to end was cancelled by its per-attempt timer
    cdef readonly double idle_time   # seconds with no attempt in flight
    cdef double _idle_since
    cdef readonly int reason
    cdef bint _overflowed       # committed because the replay buffer overflowed
    cdef double _last_start
    cdef double _heard_at       # when headers with metadata committed the call (-1: they did not)
    cdef int _quiet             # attempts whose empty headers came
    cdef readonly bint headers_ahead  # the winner answered well before its status: see HeadersWatch
    cdef public HeadersWatch watch    # the method's (hedged unary-unary calls; else None): told of it
    cdef public RetryBudget budget  # grpc_retry.retry_budget's, shared by the target's calls (None: none)
    cdef public unsigned long long request_hash  # ring_hash: where on the ring the call's picks start
    cdef public double fault_delay  # (A33) seconds its first attempt waits (0: none), set before start()
    cdef public int fault_code      # (A33) the status it then ends with, no attempt sent (0: none)
    cdef int _budget_held       # retries the budget counts in flight for this call (decided, not yet ended)
    cdef public int flush_turns  # FLUSHes a timed call's due timer may take (its driver's inputs can queue)
    cdef int _flushes           # FLUSHes taken by the due timer (0: none pending)
    cdef bint _flush_told       # headers were told since the first
    cdef public list notes      # decisions, for telemetry (None: not kept)
    cpdef list start(self, double now, object request=*)
    cpdef list send_message(self, bytes data, double now)
    cpdef list half_close(self, double now)
    cpdef list wrote(self, int n, double now)
    cpdef list headers(self, int n, double now, bint empty=*)
    cpdef list message(self, int n, double now)
    cpdef list status(self, int n, int code, object details, object trailing_metadata, double now, bint headers=*,
                      bint response=*)
    cpdef list timer(self, double now)
    cpdef list flushed(self, double now)
    cpdef list exchange_timer(self, double now, bint headers)
    cpdef list subchannels_changed(self, double now)
    cpdef list cancel(self, int code, double now)
    cpdef list take_notes(self)
    cpdef int previous(self, int n)
    cpdef bint wants_message(self, int n)
    cdef _impossible(self, str event)
    cdef list _answered(self, int n, str event, double now)
    cdef void _answer(self, int n, _Attempt a, double now, list out) except *
    cdef void _commit_pending(self, list out) except *
    cdef void _commit_to(self, int n, list out) except *
    cdef double _backoff(self, long pushback) except? -1
    cdef bint _due(self, double now)
    cdef void _pump(self, double now, list out) except *
    cdef bint _may_start_later(self)
    cdef double _wake_at(self, double now)
    cdef void _set_timer(self, double at, list out) except *
    cdef void _settle_state(self)


cpdef str traceparent(object trace_id, object span_id, object flags)  # (a C call from the telemetry)
