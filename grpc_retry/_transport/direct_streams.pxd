# Compiled (the .py stays its source): see grpc_retry/_grpc_internals.pxd.

from grpc_retry._grpc_internals cimport SyncAttempt, augmented_metadata, decode, determined, read_status, tell
