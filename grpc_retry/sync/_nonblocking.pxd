# Compiled as an extension type (the .py stays its source): see setup.py.

from grpc_retry.sync._attempts cimport _Attempts


cdef class _NonBlocking(_Attempts):
    cdef public object _attempts, _blocking, _call_callbacks, _calls, _changed, _current, _deferred, _delivered
    cdef public object _done_callbacks, _draining, _ending, _exhausted, _finished, _hedged, _watched, _last
    cdef public object _listener, _live, _local_details, _lock, _outboxes, _peek, _polled, _poller, _pulling
    cdef public object _queue, _reads, _refusal, _requests, _responses, _serializer, _timer
    cdef public object _timer_token, _tokens, _unpolled, _wait_token
