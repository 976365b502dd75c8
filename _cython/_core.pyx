# cython: language_level=3
"""grpc_retry's compiled core: the call machine (one logical call's retries, hedges, replay and commit), and
what it uses: the throttle, the replay budget, method policies, pushback and RetryInfo, the picker; and the W3C
traceparent its telemetry writes on each attempt.

Sans-I/O: nothing here touches grpcio, threads, asyncio or the clock. The drivers (aio/, sync/) feed events in
with the current time and perform the actions that come back. Each topic lives in its own include file.
"""

from cpython.long cimport PyLong_AsUnsignedLongLongMask
from libc.math cimport INFINITY
from libc.string cimport memcmp

include "status.pxi"
include "actions.pyx.pxi"
include "throttle.pyx.pxi"
include "budget.pyx.pxi"
include "buffer.pyx.pxi"
include "hedging.pyx.pxi"
include "headerswatch.pyx.pxi"
include "policy.pyx.pxi"
include "pushback.pyx.pxi"
include "retryinfo.pyx.pxi"
include "ring.pyx.pxi"
include "picker.pyx.pxi"
include "machine.pyx.pxi"
include "attempts.pyx.pxi"
include "answers.pyx.pxi"
include "transparent.pyx.pxi"
include "end.pyx.pxi"
include "tracecontext.pyx.pxi"
