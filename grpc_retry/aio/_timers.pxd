# Compiled as an extension type (the .py stays its source): see setup.py. A hedged call arms and
# disarms a timer here; its own attributes are then C struct fields, not looked up by name.

cdef class CallTimers:
    cdef public object _loop, _heap, _seq, _handle, _handle_at, _dead
