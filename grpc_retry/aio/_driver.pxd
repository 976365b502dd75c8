# Compiled as an extension type (the .py stays its source): see setup.py. Its subclasses (the call
# shapes, with grpc.aio's abstract call classes) are Python classes over it.

from grpc_retry._driver cimport CallDriver, grpc_details, trailing_with_attempts
from grpc_retry._transport.ends cimport EndWaiter, aio_initial_metadata, aio_locally_cancelled, aio_status


cdef class _Call(CallDriver):
    cdef object __weakref__
    cdef public object _channel
    cdef public dict _attempts
    cdef public object _loop, _watched, _last, _current, _winner, _timer, _listener, _local_details
    cdef public object _refusal, _done, _code, _details, _initial, _trailing, _debug, _response, _waiters, _changed
    cdef public object _callbacks, _watchers, _peek, _reads, _late, _delivered, _style
    cpdef _refused(self, error)
    cpdef _follow(self, n, attempt)
    cpdef _broken(self)
    cpdef _act(self, actions)
    cpdef _ended(self, n, attempt, headers, response)
    cpdef _stream_ended(self, n, attempt)
    cpdef _headers_came(self, n, attempt)
    cpdef _headers_first_ended(self, n, attempt, response)
    cpdef _direct_ended(self, n, attempt, response)
    cpdef _cancel(self, details, code=*)
    cpdef _finish(self, code, details, initial, trailing, debug)
    cpdef _stop_tasks(self)
    cpdef _wake_readers(self)
    cpdef _end_waiter(self)
    cpdef _raise_if_failed(self)
