# Compiled as extension types (the .py stays their source): see _grpc_internals.pxd. Call and StreamingCall are
# Python classes over _NonBlocking (with grpcio's abstract classes).

from grpc_retry._driver cimport CallDriver, grpc_details


cdef class _Attempts(CallDriver):
    cdef public object _error, _response, _final
    cdef _init_attempts(self, method, machine, request, metadata, credentials, wait_for_ready, compression,
                        stream_request)
    cdef _timeout(self)
    cpdef _outcome(self, call, previous, response, delivered=*)
    cpdef _local(self, code, details)


cdef class BlockingCall(_Attempts):
    cdef public object _next, _timer_at, _generation, _ended, _last, _local_details, _with_call
    cpdef run(self, with_call)
    cdef _timeout(self)
    cdef bint _timed_out(self, details, initial) except -1


cdef class _NonBlocking(_Attempts):
    cdef public object _attempts, _blocking, _call_callbacks, _calls, _changed, _current, _deferred, _delivered
    cdef public object _done_callbacks, _draining, _ending, _exhausted, _finished, _graces, _hedged, _watched, _last
    cdef public object _listener, _live, _local_details, _lock, _outboxes, _peek, _polled, _poller, _pulling
    cdef public object _queue, _reads, _refusal, _requests, _responses, _serializer, _silent, _heard, _timer
    cdef public object _timer_token, _tokens, _unpolled, _wait_token
    cpdef _reading(self, peeked=*)
    cpdef _until_told(self, n)
