"""The backends under a channel, as C-core's client channel has them: a target resolved to addresses
(target.py, resolution.py), a subchannel per address with its lifecycle in a set the compiled picker chooses from
(subchannels.py), and connectivity watched per flavor (sync.py: one poller thread per process; aio.py: a task per
subchannel). Subchannels are grpcio's own channel classes; nothing here imports the channel modules."""

from grpc_retry._backends.aio import AioSubchannels
from grpc_retry._backends.sync import SyncSubchannels, serially
from grpc_retry._backends.target import Target, parse_target

__all__ = ["AioSubchannels", "SyncSubchannels", "Target", "parse_target", "serially"]
