"""What a unary call that shows its response headers first costs, on plain grpc.aio (no retry layer): CPU per
call of each shape divided by a grpc.aio unary call's, in alternating rounds.

- "unary_stream": grpcio's cheapest public shape that reports headers first, a unary-stream call with one response
  whose headers are awaited before its message (grpc_retry's sync channel hedges unary calls in it);
- "two_batches": the attempt grpc_retry's asyncio channel hedges unary calls in (`AioMethod`, headers first), two
  batches on grpc.aio's Cython call, in flight together: the request with the headers, and the response with the status.

And on sync grpcio (`sync_over_blocking`: CPU per call over a blocking unary call's, a thread per call in flight),
the public shapes a sync unary attempt can take that another thread can cancel, or that show headers first:

- "future": `future().result()`, one batch; grpcio's channel starts its spin thread with a call that overlaps no
  other of the channel's and ends it with that call;
- "unary_stream": a unary-stream call, headers read before the message, on the caller's thread;
- "single_threaded": the same on a channel with `grpc.experimental.ChannelOptions.SingleThreadedUnaryStream`, its
  events taken by the caller's thread (no spin thread). Cancelled from another thread, such a call keeps batches
  that no public method drains: `leak_kib_per_cancelled` is the memory it holds per call cancelled that way.

And the floors of two more of the portable transport's sync shapes, on sync grpcio alone (`sync_floors`: CPU per
call of the shape over grpcio's own call it stands for):

- "stream_unary_future": a stream-unary call (two requests) as `future().result()`, over the blocking call: the
  one stream-unary attempt another thread can cancel (a failing request iterator must cancel the call, not
  half-close it), with the spin thread a managed call starts when it overlaps no other;
- "stream_headers_waited": a response stream read to its end while a worker thread waits in `initial_metadata()`,
  over the stream read alone: how grpcio's public sync API tells a response stream's headers (what stops a
  per-attempt receive timer whether or not the application reads).

And the floor of the portable transport's asyncio client-streaming attempt, on grpc.aio alone (`aio_floors`: CPU
per call over grpc.aio's call given a request iterator):

- "stream_unary_written": the shape the attempt takes: a stream-unary call made without an iterator, whose two
  messages and half-close a task writes (`write()`, `done_writing()`) once `wait_for_connection()` returned (the
  messages are the call's replay buffer's, not the application's iterator), its response awaited by a task of its
  own (the driver learns of the end whether or not the application awaits).

Prints one JSON object as its last line. Usage: python bench/headers_shape.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from concurrent import futures

import grpc
import grpc.experimental
from overhead import PAYLOAD, SERVICE, _alternate, _sync_runner, start_server


async def _measure(target: str, calls: int, rounds: int) -> dict:
    from grpc_retry._transport.direct_aio import AioMethod

    channel = grpc.aio.insecure_channel(target)
    unary, one = channel.unary_unary(f"/{SERVICE}/Unary"), channel.unary_stream(f"/{SERVICE}/One")
    headers_first = AioMethod(unary, True)

    async def unary_call():
        await unary(PAYLOAD)

    async def unary_stream_call():
        call = one(PAYLOAD)
        await call.initial_metadata()
        await call.read()
        await call.code()

    async def two_batches_call():
        attempt = headers_first(PAYLOAD, timeout=None, metadata=(), credentials=None, wait_for_ready=None,
                                compression=None)
        await attempt.code()

    shapes = {"unary": unary_call, "unary_stream": unary_stream_call, "two_batches": two_batches_call}
    result: dict = {}
    for inflight in (1, 16):
        samples = await _aio_rounds(shapes, calls, rounds, inflight)
        for name in ("unary_stream", "two_batches"):
            result.setdefault(name, {})[str(inflight)] = round(statistics.median(
                s / u for s, u in zip(samples[name], samples["unary"], strict=True)), 3)
    await channel.close()
    return result


async def _aio_rounds(shapes: dict, calls: int, rounds: int, inflight: int) -> dict:
    """CPU per call of each shape (`calls` a round, `inflight` at once), in rounds of alternating order."""
    samples: dict = {name: [] for name in shapes}
    for r in range(rounds):
        order = list(shapes.items())
        for name, make in (order if r % 2 == 0 else order[::-1]):
            async def worker(n, make=make):
                for _ in range(n):
                    await make()

            start = time.process_time()
            await asyncio.gather(*(worker(calls // inflight) for _ in range(inflight)))
            samples[name].append((time.process_time() - start) / calls)
    return samples


def _sync_measure(target: str, calls: int, rounds: int) -> dict:
    channel = grpc.insecure_channel(target)
    single = grpc.insecure_channel(target, options=[(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)])
    unary, stream = channel.unary_unary(f"/{SERVICE}/Unary"), channel.unary_stream(f"/{SERVICE}/One")
    single_stream = single.unary_stream(f"/{SERVICE}/One")

    def future(request):
        return unary.future(request).result()

    def read_stream(make):
        def one(request):
            call = make(request)
            call.initial_metadata()
            for _ in call:
                pass
        return one

    shapes = {"blocking": unary, "future": future, "unary_stream": read_stream(stream),
              "single_threaded": read_stream(single_stream)}
    result: dict = {}
    for inflight in (1, 16, 128):
        samples = _alternate({name: _sync_runner(shape, calls, inflight) for name, shape in shapes.items()},
                             calls, rounds)
        for name in ("future", "unary_stream", "single_threaded"):
            result.setdefault(name, {})[str(inflight)] = round(statistics.median(
                s / b for s, b in zip(samples[name], samples["blocking"], strict=True)), 3)
    result["leak_kib_per_cancelled"] = round(_cancelled_leak(single, stream_name=f"/{SERVICE}/Slow"), 1)
    channel.close()
    single.close()
    return result


def _sync_floors(target: str, calls: int, rounds: int) -> dict:
    channel = grpc.insecure_channel(target)
    client_stream = channel.stream_unary(f"/{SERVICE}/ClientStream")
    stream = channel.unary_stream(f"/{SERVICE}/Stream")
    waiters = futures.ThreadPoolExecutor(8)

    def blocking_stream_unary(request):
        return client_stream(iter((request, request)))

    def stream_unary_future(request):
        return client_stream.future(iter((request, request))).result()

    def read(request):
        for _ in stream(request):
            pass

    def read_headers_waited(request):
        call = stream(request)
        waiters.submit(call.initial_metadata)
        for _ in call:
            pass

    pairs = {"stream_unary_future": (blocking_stream_unary, stream_unary_future),
             "stream_headers_waited": (read, read_headers_waited)}
    result: dict = {}
    for name, (base, shape) in pairs.items():
        for inflight in (1, 16, 128):
            samples = _alternate({"base": _sync_runner(base, calls, inflight),
                                  "shape": _sync_runner(shape, calls, inflight)}, calls, rounds)
            result.setdefault(name, {})[str(inflight)] = round(statistics.median(
                s / b for s, b in zip(samples["shape"], samples["base"], strict=True)), 3)
    waiters.shutdown()
    channel.close()
    return result


async def _aio_floors(target: str, calls: int, rounds: int) -> dict:
    channel = grpc.aio.insecure_channel(target)
    client_stream = channel.stream_unary(f"/{SERVICE}/ClientStream")
    loop = asyncio.get_running_loop()

    async def given_iterator():
        await client_stream(iter((PAYLOAD, PAYLOAD)))

    async def written():
        call = client_stream()

        async def send():
            await call.wait_for_connection()
            await call.write(PAYLOAD)
            await call.write(PAYLOAD)
            await call.done_writing()

        async def follow():
            return await call

        loop.create_task(send())
        await loop.create_task(follow())

    result: dict = {}
    for inflight in (1, 16, 128):
        samples = await _aio_rounds({"base": given_iterator, "shape": written}, calls, rounds, inflight)
        result.setdefault("stream_unary_written", {})[str(inflight)] = round(statistics.median(
            s / b for s, b in zip(samples["shape"], samples["base"], strict=True)), 3)
    await channel.close()
    return result


def _rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4


def _cancelled_leak(single, stream_name: str, count: int = 200) -> float:
    """Memory held per single-threaded call cancelled from another thread while its caller reads it."""
    slow = single.unary_stream(stream_name)

    def one():
        call = slow(PAYLOAD)
        cancel = threading.Timer(0.002, call.cancel)
        cancel.start()
        try:
            for _ in call:
                pass
        except grpc.RpcError:
            pass
        cancel.join()

    one()
    before = _rss_kib()
    for _ in range(count):
        one()
    return (_rss_kib() - before) / count


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args(argv)
    process, port = start_server()
    target = f"127.0.0.1:{port}"
    try:
        ratios = asyncio.run(_measure(target, args.calls, args.rounds))
        sync = _sync_measure(target, args.calls, args.rounds)
        floors = _sync_floors(target, args.calls, args.rounds)
        aio_floors = asyncio.run(_aio_floors(target, args.calls, args.rounds))
    finally:
        process.kill()
    result = {"grpcio": grpc.__version__, "over_unary": ratios, "sync_over_blocking": sync, "sync_floors": floors,
              "aio_floors": aio_floors}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
