# cython: language_level=3
"""grpc_retry's compiled core: the per-call retry state machine, its replay buffers and throttling.

Sans-I/O: nothing here touches grpcio, threads, asyncio or the clock. Drivers feed events in (an attempt
began, a message was sent, headers or a status arrived) with the current time as an argument, and act on what
comes back (retry after a delay, deliver the status, commit). Each topic lives in its own include file.
"""

from libc.math cimport INFINITY

include "status.pxi"
include "throttle.pyx.pxi"
include "buffer.pyx.pxi"
include "policy.pyx.pxi"
include "pushback.pyx.pxi"
include "retry_call.pyx.pxi"
include "hedging_call.pyx.pxi"
include "picker.pyx.pxi"
include "machine.pyx.pxi"
