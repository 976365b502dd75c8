"""grpc_retry's xDS client: the bootstrap (bootstrap.py), read as gRPC's core reads it."""
