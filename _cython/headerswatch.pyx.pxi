# Whether a hedged unary-unary call's first attempt may be one batch, as an unhedged call's is (per channel and
# method). Its headers then show with its response; the second batch a headers-first attempt needs (C-core tells
# headers only through a batch of their own) is ~15% of such a call's instructions.
#
# A6 commits a hedged call on response headers, and while the first attempt is out alone nothing waits on them but
# the next hedge's timer. Servers send a unary response's headers with it (A6 asks them to, unless the application
# sends them early): one batch then decides as the headers would have. A server that sends them well ahead
# (_EARLY_HEADERS, answers.pyx.pxi) would see a hedge go out that its headers should have stopped; so the method's
# first WATCH_FIRST calls, one in every WATCH_EVERY after, and every hedge show their headers first, and once a
# call's machine sees headers sent ahead (`headers_ahead`), every first attempt does from then on.

cdef long _WATCH_FIRST = 16
cdef long _WATCH_EVERY = 32
WATCH_FIRST = _WATCH_FIRST
WATCH_EVERY = _WATCH_EVERY


cdef class HeadersWatch:

    def __init__(self, long first=_WATCH_FIRST, long every=_WATCH_EVERY):
        self.first = first
        self.every = every
        self.calls = 0
        self.early = False

    cpdef bint first_whole(self):
        """A hedged call starts: whether its first attempt may be one batch."""
        if self.early:
            return False
        self.calls += 1
        return self.calls > self.first and self.calls % self.every != 0
