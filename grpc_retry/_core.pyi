"""Types of the compiled core (_cython/_core.pyx): what the drivers call. Keep in step with the .pxi files."""

from typing import Any, Dict, Iterable, List, Optional, Tuple

# Actions the machine asks a driver to perform: (kind, attempt number, argument) tuples.
START: int
WRITE: int
HALF_CLOSE: int
CANCEL: int
COMMIT: int
TIMER: int
WAIT: int
UNWAIT: int
DELIVER: int
END: int
FLUSH: int
ACTION_NAMES: Tuple[str, ...]
STATE_NAMES: Tuple[str, ...]
REASONS: Tuple[str, ...]
NOT_SENT: int
REFUSED: int
NOTE_START: int
NOTE_STATUS: int
NOTE_BACKOFF: int
NOTE_HEDGE_NOW: int
NOTE_TRANSPARENT: int
NOTE_COMMIT: int
NOTE_STOP: int
NOTE_END: int
NOTE_RECV_TIMEOUT: int
NOTE_SERVER_DELAY: int
ORIGINAL: int
RETRY: int
HEDGE: int
TRANSPARENT: int
COMMIT_ANSWER: int
COMMIT_OVERFLOW: int
HEADERS_GRACE: float
EARLY_HEADERS: float
WATCH_FIRST: int
WATCH_EVERY: int
PICK_FIRST: int
ROUND_ROBIN: int
RING_HASH: int
RING_SIZE_CAP: int
MAX_RING_SIZE: int

def xxh64(data: bytes, seed: int = ...) -> int: ...

class Ring:
    size: int
    def __init__(self, endpoints: Iterable[Tuple[str, float, int]], min_size: int = ...,
                 max_size: int = ...) -> None: ...
    def entries(self) -> List[Tuple[int, int]]: ...
    def start(self, h: int) -> int: ...

BUCKET_ERROR: float
DECAY: float
KEEP: float
MIN_SAMPLES: float
MAX_SLACK: float
OUTLIERS: float
EXTRA_INTERVAL: float
START_CALLS: int

Action = Tuple[Any, ...]

class MachineError(RuntimeError): ...

def transparent_kind(code: int, details: Any) -> int: ...
def parse_pushback(trailing_metadata: Any) -> int: ...
def parse_retry_info(trailing_metadata: Any) -> float: ...
def traceparent(trace_id: int, span_id: int, flags: int) -> str: ...

class RetryThrottle:
    max_milli_tokens: int
    milli_token_ratio: int
    milli_tokens: int
    def __init__(self, max_milli_tokens: int, milli_token_ratio: int) -> None: ...
    def record_failure(self) -> bool: ...
    def record_success(self) -> None: ...
    def allows_retry(self) -> bool: ...
    @property
    def tokens(self) -> float: ...

class RetryBudget:
    concurrent: bool
    percent: float
    interval: float
    min_interval: float
    min_count: int
    max_in_flight: int
    calls_in_flight: int
    retries_in_flight: int
    refused: int
    credit: int
    def __init__(self, concurrent: bool, percent: float, min_count: int, interval: float = 10.0,
                 min_interval: float = 1.0, max_in_flight: int = -1, credit: int = 0) -> None: ...
    def call_started(self, now: float) -> None: ...
    def call_ended(self) -> None: ...
    def try_retry(self, now: float) -> bool: ...
    def retry_ended(self) -> None: ...
    @property
    def retries_in_window(self) -> int: ...
    @property
    def calls_in_window(self) -> int: ...

class BufferPool:
    capacity: int
    used: int
    def __init__(self, capacity: int) -> None: ...

class HeadersWatch:
    first: int
    every: int
    calls: int
    early: bool
    def __init__(self, first: int = ..., every: int = ...) -> None: ...
    def first_whole(self) -> bool: ...

class HedgingControl:
    quantile: float
    floor: float
    max_extra_load: float
    extra: Optional[RetryBudget]
    def __init__(self, floor: float, quantile: float = 0.0, max_extra_load: float = -1.0) -> None: ...
    def record(self, latency: float, now: float) -> None: ...
    def record_censored(self, age: float, now: float) -> None: ...
    def estimate(self, now: float) -> float: ...
    def histogram(self) -> Tuple[Dict[float, float], Dict[float, float]]: ...
    def delay(self, now: float) -> float: ...
    @property
    def budget_stopped(self) -> int: ...

class RetryStats:
    retries: int
    retries_failed: int
    calls: int
    attempts: int
    transparent_retries: int
    committed_by_overflow: int
    stopped_by_throttling: int
    stopped_by_pushback: int
    stopped_by_attempt_limit: int
    attempts_timed_out: int
    server_delays: int
    refused_by_budget: int
    def histogram(self) -> Dict[str, int]: ...
    def as_dict(self) -> Dict[str, Any]: ...

class CallPolicy:
    max_attempts: int
    initial_backoff: float
    max_backoff: float
    backoff_multiplier: float
    retryable_mask: int
    timeout: float
    wait_for_ready: Optional[bool]
    hedging_delay: float
    hedge: Optional[HedgingControl]
    recv_timeout: float
    max_server_delay: float
    stats: RetryStats
    def __init__(self, max_attempts: int = 1, initial_backoff: float = 0.0, max_backoff: float = 0.0,
                 backoff_multiplier: float = 1.0, retryable_codes: Iterable[int] = (),
                 timeout: float = ..., wait_for_ready: Optional[bool] = None, hedging_delay: float = -1.0,
                 hedge: Optional[HedgingControl] = None, recv_timeout: float = ...,
                 max_server_delay: float = 30.0) -> None: ...
    @property
    def hedging(self) -> bool: ...
    def is_retryable(self, code: int) -> bool: ...

class Picker:
    policy: int
    generation: int
    resolved: bool
    births: int
    ejected_count: int
    counting: bool
    last_error: Optional[str]
    def __init__(self, policy: int, size: int) -> None: ...
    def born(self, index: int) -> int: ...
    def eject(self, index: int, ejected: bool) -> None: ...
    def is_ejected(self, index: int) -> bool: ...
    def take_counts(self) -> List[Tuple[int, int]]: ...
    @property
    def size(self) -> int: ...
    def states(self) -> List[int]: ...
    def resize(self, size: int) -> None: ...
    ring: Optional[Ring]
    loads: bool
    def take_loads(self) -> List[Tuple[int, int, int, int]]: ...
    def set_schedule(self, schedule: Optional[List[int]]) -> None: ...
    def reborn(self, index: int) -> None: ...
    def forget(self, used: int, since: int) -> int: ...
    def set_state(self, index: int, state: int) -> None: ...
    def state(self, index: int) -> int: ...
    def all_failed(self) -> bool: ...
    def pick(self, used: Any, request_hash: int = ...) -> int: ...

class CallMachine:
    policy: CallPolicy
    deadline: float
    max_attempts: int
    hedging: bool
    transparent_enabled: bool
    recv_timeout: float
    watched: bool
    state: int
    live: int
    counted: int
    winner: int
    committed: bool
    next_at: float
    timer_at: float
    waiting: bool
    base: int
    total: int
    buffered: int
    half_closed: bool
    transparent_retries: int
    recv_timeouts: int
    recv_timeout_ended: bool
    headers_ahead: bool
    watch: Optional[HeadersWatch]
    flush_turns: int
    budget: Optional[RetryBudget]
    request_hash: int
    fault_delay: float
    fault_code: int
    idle_time: float
    reason: int
    notes: Optional[List[Tuple[Any, ...]]]
    def __init__(self, policy: CallPolicy, throttle: Optional[RetryThrottle], pool: BufferPool, picker: Picker,
                 per_rpc_limit: int, deadline: float, rng: Any, enabled: bool = True, wait_for_ready: bool = False,
                 unary_request: bool = True) -> None: ...
    def start(self, now: float, request: Optional[bytes] = None) -> List[Action]: ...
    def send_message(self, data: bytes, now: float) -> List[Action]: ...
    def half_close(self, now: float) -> List[Action]: ...
    def wrote(self, n: int, now: float) -> List[Action]: ...
    def headers(self, n: int, now: float, empty: bool = False) -> List[Action]: ...
    def message(self, n: int, now: float) -> List[Action]: ...
    def status(self, n: int, code: int, details: Any, trailing_metadata: Any, now: float,
               headers: bool = False, response: bool = False) -> List[Action]: ...
    def timer(self, now: float) -> List[Action]: ...
    def flushed(self, now: float) -> List[Action]: ...
    def exchange_timer(self, now: float, headers: bool) -> List[Action]: ...
    def subchannels_changed(self, now: float) -> List[Action]: ...
    def cancel(self, code: int, now: float) -> List[Action]: ...
    def take_notes(self) -> Optional[List[Tuple[Any, ...]]]: ...
    def previous(self, n: int) -> int: ...
    def wants_message(self, n: int) -> bool: ...
    @property
    def attempts(self) -> int: ...
    @property
    def retries(self) -> int: ...
    @property
    def hedges(self) -> int: ...
    @property
    def reason_name(self) -> str: ...
    @property
    def state_name(self) -> str: ...
