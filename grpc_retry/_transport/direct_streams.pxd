# Compiled (the .py stays its source): see setup.py.

from grpc_retry._transport.ends cimport SyncAttempt, decode, report_end, tell
from grpc_retry._transport.grpc_private cimport augmented_metadata, determined, read_status
