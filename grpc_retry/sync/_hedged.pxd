# Compiled as an extension type (the .py stays its source): see _grpc_internals.pxd.

from grpc_retry.sync._call cimport _Attempts


cdef class HedgedBlockingCall(_Attempts):
    cdef public object _lock, _attempt, _out, _timer, _timer_at, _timed_here, _silent, _handed, _ending, _ended, _changed
    cdef public object _local_details
