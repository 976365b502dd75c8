# Compiled as extension types (the .py stays their source): see setup.py. A blocking hedged call sets
# and cancels a timer each (its hedging delay, while it polls its attempt).

cdef class TimerHandle:
    cdef public object callback, cancelled, shared
    cpdef cancel(self)


cdef class Timers:
    cdef public list _heap
    cdef public dict _lanes
    cdef public object _lock, _cond, _seq, _thread, _wakes_at
    cpdef TimerHandle schedule(self, delay, callback, shared=*, lane=*)
    cdef _next_lane(self)
