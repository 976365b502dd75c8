# What the call machine (machine.pyx.pxi) tells its driver: the actions each event returns, performed in order,
# and the notes it takes of its decisions.
#
# Actions: (START, n, address, previous)  start attempt n on that address, with that metadata count
#          (WRITE, n, k, data)            write message k (its bytes) to attempt n; answer with wrote(n)
#          (HALF_CLOSE, n)                no more messages for attempt n
#          (CANCEL, n)                    cancel attempt n; it is over for the machine: report nothing more of it
#          (COMMIT, n)                    attempt n carries the call: pass its reads straight to the application
#          (TIMER, at)                    arm the call's one timer for monotonic time `at` (inf: disarm)
#          (WAIT, generation)             call subchannels_changed() at the first change after that generation
#          (UNWAIT,)                      forget that wait
#          (DELIVER, n)                   the call ends with attempt n's result (its status, metadata, response)
#          (END, code)                    the call ends with a status no server sent (deadline, cancel, no address,
#                                         the last attempt's perAttemptRecvTimeout: then `recv_timeout_ended`)
#          (FLUSH,)                       a timed call's due timer first waits: tell the inputs queued, then flushed()
# DELIVER and END come last, once per call, after the CANCELs of whatever was still live.
#
# Notes: when the driver sets `notes` to a list (telemetry is on), the machine appends what it decided and why, for
# the trace log, spans and metrics; when it is None (the default) the machine spends one test per decision on it.
#   (NOTE_START, n, address, previous, why, after)  attempt n started; why: ORIGINAL, RETRY, HEDGE or TRANSPARENT;
#                                                   after: seconds since the call's previous attempt started
#   (NOTE_STATUS, n, code)                          attempt n ended with that status
#   (NOTE_BACKOFF, n, delay, next, max)             the next attempt (number `next` of `max`) in `delay` seconds
#   (NOTE_HEDGE_NOW, n)                             a non-fatal status brought the next hedge forward
#   (NOTE_TRANSPARENT, n, kind)                     attempt n goes again transparently (NOT_SENT, REFUSED)
#   (NOTE_COMMIT, n, cause)                         attempt n carries the call; cause: COMMIT_ANSWER, COMMIT_OVERFLOW
#   (NOTE_STOP, reason, value)                      no further attempt: throttled (value: tokens), pushback,
#                                                   hedge budget
#   (NOTE_END, reason, code, n)                     the call ended: with a status no server sent (its code), or
#                                                   with attempt n's (code -1)
#   (NOTE_RECV_TIMEOUT, n)                          attempt n was cancelled by its perAttemptRecvTimeout
#   (NOTE_SERVER_DELAY, n, delay, honoured)         attempt n's status carried a RetryInfo delay (seconds)

cdef enum:
    A_START = 0
    A_WRITE = 1
    A_HALF_CLOSE = 2
    A_CANCEL = 3
    A_COMMIT = 4
    A_TIMER = 5
    A_WAIT = 6
    A_UNWAIT = 7
    A_DELIVER = 8
    A_END = 9
    A_FLUSH = 10

START, WRITE, HALF_CLOSE, CANCEL, COMMIT, TIMER, WAIT, UNWAIT, DELIVER, END, FLUSH = range(11)
ACTION_NAMES = ("START", "WRITE", "HALF_CLOSE", "CANCEL", "COMMIT", "TIMER", "WAIT", "UNWAIT", "DELIVER", "END",
                "FLUSH")

(NOTE_START, NOTE_STATUS, NOTE_BACKOFF, NOTE_HEDGE_NOW, NOTE_TRANSPARENT, NOTE_COMMIT, NOTE_STOP, NOTE_END,
 NOTE_RECV_TIMEOUT, NOTE_SERVER_DELAY) = range(10)
ORIGINAL, RETRY, HEDGE, TRANSPARENT = range(4)
COMMIT_ANSWER, COMMIT_OVERFLOW = range(2)
