"""What the gateway's relay costs per token, without a model.

    .venv/bin/python bench/relay_cost.py [--tokens 20000] [--json PATH]

The path of one token from the worker to the HTTP body, piece by piece:

  worker:  Delta(req_id, text, n_tokens) -> msgpack (protocol.wire worker codec) -> PUSH
  ipc:     ZeroMQ PUSH -> PULL over an ipc:// socket (two ZeroMQ I/O-thread hops)
  gateway: PULL -> typed msgpack decode (gateway codec) -> the request's asyncio.Queue
           -> build + JSON-encode one ChatCompletionChunk (gateway/http/relay.py's `_chunk`)

Measured four ways:
  parts       each CPU step alone, in a tight loop (ns per call, median of batches)
  sync        one token at a time round trip in one thread: encode, send, recv, decode,
              chunk; the latency a token pays, ZeroMQ hop included (median, p99 in us)
  pipelined   send N, then receive and relay N: the CPU cost per token when tokens queue
  asyncio     the gateway's shape: a worker process sends paced tokens (one every
              --pace-us), a zmq.asyncio reader task routes them to an asyncio.Queue, a
              consumer builds the chunk; latency from before encode to chunk bytes
              (median, p99 in us). The send instant rides in the Delta's n_tokens field.

Litestar's SSE framing (`data: ...\\n\\n`), the HTTP write and the client's parse
come on top and are not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import zmq
import zmq.asyncio

from bench.stats import pct
from protocol.chat import ChatCompletionChunk, ChunkChoice, ChunkDelta
from protocol.wire import Delta, gateway_codec, worker_codec

# Typical SmolLM2 pieces: mostly one short word with its leading space.
PIECES = [" the", " dragon", ",", " who", " learned", " to", " code", " in", " Python", ".", "\n", " He", " wrote"]


def chunk_builder():  # type: ignore[no-untyped-def]
    """gateway.http.relay's own chunk function when importable; else the same construction here."""
    try:
        from gateway.http.relay import Completion, _chunk
        from gateway.ops.accounting import Accounting
        from gateway.ops.metrics import Metrics

        model = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"
        c = Completion(model, Accounting(Metrics(process=False).timer(model)))
        return (lambda text: _chunk(c, 0, ChunkDelta(content=text))), "gateway.http.relay._chunk"
    except Exception:  # the relay is being edited by others; measure the documented shape
        import msgspec

        enc = msgspec.json.Encoder().encode
        cid, created, model = (
            "chatcmpl-0123456789abcdef01234567",
            int(time.time()),
            "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1",
        )

        def build(text: str) -> bytes:
            return enc(ChatCompletionChunk(id=cid, object="chat.completion.chunk", created=created, model=model,
                                           choices=[ChunkChoice(index=0, delta=ChunkDelta(content=text))]))  # fmt: skip

        return build, "local copy of gateway.http.relay._chunk"


def per_call_ns(fn, n: int, batches: int = 7) -> float:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for i in range(n):
            fn(i)
        out.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(out)


def parts(n: int, build) -> dict[str, float]:  # type: ignore[no-untyped-def]
    wenc = worker_codec().encode
    gdec = gateway_codec().decode
    frames = [wenc(Delta(7, PIECES[i % len(PIECES)], i)) for i in range(len(PIECES))]
    return {
        "delta_struct_ns": per_call_ns(lambda i: Delta(7, PIECES[i % 13], i), n),
        "msgpack_encode_ns": per_call_ns(lambda i: wenc(Delta(7, PIECES[i % 13], i)), n),
        "msgpack_decode_ns": per_call_ns(lambda i: gdec(frames[i % 13]), n),
        "chunk_build_json_ns": per_call_ns(lambda i: build(PIECES[i % 13]), n),
        "chunk_bytes": len(build(" dragon")),
    }


def sockets(ctx: zmq.Context, tmp: str) -> tuple[zmq.Socket, zmq.Socket]:
    addr = f"ipc://{tmp}/relay.out"
    pull = ctx.socket(zmq.PULL)  # the gateway binds, as gateway/supervisor/handle.py does
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(addr)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(addr)
    return push, pull


def sync_round_trip(n: int, build, tmp: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    ctx = zmq.Context()
    push, pull = sockets(ctx, tmp)
    wenc = worker_codec().encode
    gdec = gateway_codec().decode
    lat = []
    try:
        for i in range(n + 500):
            t0 = time.perf_counter_ns()
            push.send(wenc(Delta(7, PIECES[i % 13], i)), copy=False)
            frame = pull.recv(copy=False)
            msg = gdec(frame.buffer)
            build(msg.text)
            if i >= 500:  # warm-up
                lat.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()
    return {"median_us": pct(lat, 50), "p99_us": pct(lat, 99)}  # type: ignore[dict-item]


def pipelined(n: int, build, tmp: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    ctx = zmq.Context()
    push, pull = sockets(ctx, tmp)
    push.setsockopt(zmq.SNDHWM, n + 10)
    pull.setsockopt(zmq.RCVHWM, n + 10)
    wenc = worker_codec().encode
    gdec = gateway_codec().decode
    per = []
    try:
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for i in range(n):
                push.send(wenc(Delta(7, PIECES[i % 13], i)), copy=False)
            t1 = time.perf_counter_ns()
            for _ in range(n):
                build(gdec(pull.recv(copy=False).buffer).text)
            t2 = time.perf_counter_ns()
            per.append(((t1 - t0) / n / 1000, (t2 - t1) / n / 1000))
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()
    send = statistics.median(p[0] for p in per)
    recv = statistics.median(p[1] for p in per)
    return {"worker_side_us": send, "gateway_side_us": recv, "total_us": send + recv}


def _paced_sender(addr: str, total: int, pace_us: float) -> None:
    """The worker, in its own process (as in production, so no GIL is shared): one Delta per step."""
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(addr)
    wenc = worker_codec().encode
    time.sleep(0.2)  # let the connection settle
    nxt = time.perf_counter()
    for i in range(total):
        nxt += pace_us / 1e6
        delay = nxt - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        # The send instant rides in n_tokens: perf_counter_ns is CLOCK_MONOTONIC, shared by processes.
        push.send(wenc(Delta(7, PIECES[i % 13], time.perf_counter_ns())), copy=False)
    push.close()
    ctx.term()


def asyncio_paced(n: int, pace_us: float, build, tmp: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    addr = f"ipc://{tmp}/relay-async.out"
    actx = zmq.asyncio.Context()
    lat: list[float] = []

    async def run() -> None:
        pull = actx.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        pull.bind(addr)
        queue: asyncio.Queue[Delta] = asyncio.Queue()
        gdec = gateway_codec().decode
        total = n + 200

        async def reader() -> None:  # WorkerHandle._route_replies, reduced to the Delta branch
            for _ in range(total):
                frame = await pull.recv(copy=False)
                msg = gdec(frame.buffer)
                if isinstance(msg, Delta):
                    queue.put_nowait(msg)

        proc = mp.get_context("spawn").Process(target=_paced_sender, args=(addr, total, pace_us), daemon=True)
        rtask = asyncio.create_task(reader())
        proc.start()
        for i in range(total):  # relay.sse: await the next Delta, build its chunk
            msg = await queue.get()
            build(msg.text)
            if i >= 200:
                lat.append((time.perf_counter_ns() - msg.n_tokens) / 1000)
        await rtask
        proc.join(10)
        pull.close(0)

    try:
        asyncio.run(run())
    finally:
        actx.term()
    return {"median_us": pct(lat, 50), "p99_us": pct(lat, 99), "pace_us": pace_us}  # type: ignore[dict-item]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=20000, help="tokens per measurement")
    p.add_argument("--pace-us", type=float, default=1000.0, help="asyncio case: one token every this many us")
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "relay_cost.json")
    a = p.parse_args(argv)
    build, builder = chunk_builder()
    with tempfile.TemporaryDirectory(prefix="geniex-relay-") as tmp:
        res = {
            "builder": builder,
            "parts": parts(min(a.tokens, 20000), build),
            "sync": sync_round_trip(a.tokens, build, tmp),
            "pipelined": pipelined(a.tokens, build, tmp),
            "asyncio": asyncio_paced(min(a.tokens, 5000), a.pace_us, build, tmp),
        }
    token_ms = 10.0
    worst = max(res["sync"]["median_us"], res["asyncio"]["median_us"])
    res["share_of_10ms_token"] = round(worst / (token_ms * 1000), 5)
    pr = res["parts"]
    print(f"relay cost per token ({builder})")
    print(f"  parts:     Delta {pr['delta_struct_ns']:.0f} ns, msgpack encode {pr['msgpack_encode_ns']:.0f} ns, "
          f"decode {pr['msgpack_decode_ns']:.0f} ns, chunk build+JSON {pr['chunk_build_json_ns']:.0f} ns "
          f"({pr['chunk_bytes']} bytes)")  # fmt: skip
    s, pl, aio = res["sync"], res["pipelined"], res["asyncio"]
    print(
        f"  sync:      one token round trip {s['median_us']:.1f} us median, {s['p99_us']:.1f} us p99 (ipc hop included)"
    )
    print(f"  pipelined: worker side {pl['worker_side_us']:.2f} us + gateway side {pl['gateway_side_us']:.2f} us "
          f"= {pl['total_us']:.2f} us CPU per token")  # fmt: skip
    print(f"  asyncio:   token every {aio['pace_us']:.0f} us -> chunk bytes in {aio['median_us']:.1f} us median, "
          f"{aio['p99_us']:.1f} us p99 (reader task + queue + event loop)")  # fmt: skip
    print(f"  worst median is {res['share_of_10ms_token']:.2%} of a 10 ms token")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=2))
    print(f"JSON: {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
