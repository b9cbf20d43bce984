"""What `--sse-ping-interval-s` (gateway/http/keepalive.py) costs a stream when nothing is slow.

    .venv/bin/python bench/keepalive_cost.py [--rounds 7] [--max-tokens 120] [--items 20000]

Two measurements, each paired (rounds alternate with and without the keep-alive, so drift in the
machine's load hits both alike):

  in-process  one stream of `--items` items through kept_alive() and bare, its items handed over
              an asyncio.Queue by a producer task as the worker handle's reader does; CPU ns per item
  server      two real servers on SmolLM2, one with `--sse-ping-interval-s 0` (off) and one with the
              default (15), `--stream-interval-ms 0` (a chunk per token, the harshest case); the same
              streamed chat completion to each in turn; the gateway process's CPU ms per token
              (psutil, the gateway only, not its worker)

It reports the medians and the median of the paired ratios (on / off).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
import psutil

from bench.launcher import Server
from gateway.http.keepalive import kept_alive

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"
ASK = "Write a long story about a dragon who learns to code."


async def _one_stream(items: int, wrapped: bool) -> float:
    """CPU ns per item of one stream fed by a producer task, as the handle's reader feeds a request."""
    queue: asyncio.Queue[int | None] = asyncio.Queue()

    async def produce() -> None:
        for i in range(items):
            queue.put_nowait(i)
            await asyncio.sleep(0)  # one item per loop turn, as replies arrive
        queue.put_nowait(None)

    async def source() -> AsyncIterator[int]:
        while (item := await queue.get()) is not None:
            yield item

    producer = asyncio.create_task(produce())
    stream = kept_alive(source(), 15.0, lambda: -1) if wrapped else source()
    t0 = time.process_time()
    n = 0
    async for _ in stream:
        n += 1
    took = time.process_time() - t0
    await producer
    assert n == items
    return took / items * 1e9


def in_process(rounds: int, items: int) -> dict[str, float]:
    off: list[float] = []
    on: list[float] = []
    for r in range(rounds):
        for wrapped in (r % 2 == 0, r % 2 == 1):
            (on if wrapped else off).append(asyncio.run(_one_stream(items, wrapped)))
    return _summary(off, on, "ns/item")


def _chat(http: httpx.Client, base: str, max_tokens: int) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": ASK}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    tokens = 0
    with http.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and (usage := json.loads(line[6:]).get("usage")):
                tokens = usage["completion_tokens"]
    return tokens


def server(rounds: int, max_tokens: int) -> dict[str, float]:
    common = ("--stream-interval-ms", "0", "--parallel", "1", "--nctx", "1024")
    off_srv = Server(Path(tempfile.mkdtemp(prefix="geniex-ka-off-")), "--sse-ping-interval-s", "0", *common)
    on_srv = Server(Path(tempfile.mkdtemp(prefix="geniex-ka-on-")), *common)
    try:
        for s in (off_srv, on_srv):
            s.wait_ready()
        http = httpx.Client(timeout=300)
        for s in (off_srv, on_srv):
            _chat(http, s.base_url, 4)  # load the model
        off: list[float] = []
        on: list[float] = []
        for r in range(rounds):
            for srv in (off_srv, on_srv) if r % 2 == 0 else (on_srv, off_srv):
                proc = psutil.Process(srv.proc.pid)
                t0 = proc.cpu_times()
                tokens = _chat(http, srv.base_url, max_tokens)
                t1 = proc.cpu_times()
                ms = ((t1.user - t0.user) + (t1.system - t0.system)) * 1e3 / max(tokens, 1)
                (off if srv is off_srv else on).append(ms)
        return _summary(off, on, "gateway CPU ms/token")
    finally:
        for s in (off_srv, on_srv):
            s.stop()


def _summary(off: list[float], on: list[float], unit: str) -> dict[str, float]:
    ratio = statistics.median(b / a for a, b in zip(off, on, strict=True) if a)
    out = {"off_median": statistics.median(off), "on_median": statistics.median(on), "paired_ratio": ratio}
    print(f"{unit}: off {out['off_median']:.4g}, on {out['on_median']:.4g}, paired on/off {ratio:.3f} "
          f"(off {[round(x, 4) for x in off]}, on {[round(x, 4) for x in on]})")  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--max-tokens", type=int, default=120)
    p.add_argument("--items", type=int, default=20000)
    p.add_argument("--skip-server", action="store_true")
    args = p.parse_args()
    in_process(args.rounds, args.items)
    if not args.skip_server:
        server(args.rounds, args.max_tokens)


if __name__ == "__main__":
    main()
