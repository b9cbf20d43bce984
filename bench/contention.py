"""Decode speed and TTFT while other programs keep the CPU busy: ours, and any other server.

    .venv/bin/python bench/contention.py [--other llama-server=http://127.0.0.1:8080/v1] [--levels 0,1,2]

A laptop is never idle: a browser tab, a compiler or an indexer runs beside the server. This
starts our server (`geniex serve`, default settings plus any `--server-arg`), then for each
round and each level of competing load (0, 1, 2 busy processes: `python3 -c 'while 1: pass'`,
the issue's stand-in) sends one streamed greedy chat request to every server, in an order
that rotates each round, so drift hits every server alike. Per server and level it reports
the median decode tok/s and TTFT, the decode speed as a fraction of the same server's idle
speed in this run, and ours / theirs. The last line is one JSON object of those figures.

The other servers are yours to start: `llama-server` built by hand from the llama.cpp that
llama-cpp-python vendors (`-m <the GGUF> -np 4 -t 2 -c 16384`), or an older build of ours.
Every request carries `--other-body` (default `{"cache_prompt": false}`: every round repeats one
prompt, which both llama-server and ours would otherwise reuse from their prompt caches).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import openai

from bench.bench import DEFAULT_MODEL, MESSAGES, log, stream_once
from bench.launcher import Server
from bench.stats import med

HOG = "while 1: pass"


class Hogs:
    """`n` busy processes for the duration of a `with` block."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Hogs:
        self.procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(self.n)]
        time.sleep(0.5 if self.n else 0)  # let the scheduler see them before the request starts
        return self

    def __exit__(self, *_exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


async def one(client: openai.AsyncOpenAI, args: argparse.Namespace, body: dict[str, Any] | None) -> dict[str, Any]:
    await asyncio.sleep(
        args.gap
    )  # each request finds the machine as the busy processes leave it, not as the last server did
    try:
        return await asyncio.wait_for(stream_once(client, args.model, args.max_tokens, MESSAGES, extra_body=body),
                                      args.timeout)  # fmt: skip
    except TimeoutError:
        return {"decode_tps": None, "ttft_ms": None, "tokens": 0, "timed_out": True}


async def measure(clients: dict[str, openai.AsyncOpenAI], args: argparse.Namespace) -> dict[str, Any]:
    # Every round repeats one prompt: no server may reuse it (ours reads the same field as llama-server).
    bodies = dict.fromkeys(clients, args.other_body)
    for name, c in clients.items():  # warm-up: loads our model
        await one(c, args, bodies[name])
    got: dict[str, dict[int, list[dict[str, Any]]]] = {n: {lv: [] for lv in args.levels} for n in clients}
    names = list(clients)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for level in args.levels:
            with Hogs(level):
                for name in order:
                    res = await one(clients[name], args, bodies[name])
                    got[name][level].append(res)
                    tps = res["decode_tps"]
                    log(f"round {r + 1}/{args.rounds} busy={level} {name}: "
                        f"{'timed out' if res.get('timed_out') else f'{tps:.1f} tok/s' if tps else 'no decode'}"
                        f", TTFT {res['ttft_ms'] or 0:.0f} ms")  # fmt: skip
    out: dict[str, Any] = {"levels": args.levels, "servers": {}}
    for name in clients:
        rows = {}
        for level in args.levels:
            xs = got[name][level]
            rows[level] = {
                "decode_tps": med([x["decode_tps"] for x in xs]),
                "ttft_ms": med([x["ttft_ms"] for x in xs]),
                "timed_out": sum(bool(x.get("timed_out")) for x in xs),
                "all_decode_tps": [x["decode_tps"] for x in xs],
            }
        idle = rows.get(0, {}).get("decode_tps")
        for level in args.levels:
            tps = rows[level]["decode_tps"]
            rows[level]["vs_own_idle"] = tps / idle if tps and idle else None
        out["servers"][name] = rows
    ours = out["servers"]["ours"]
    out["ours_vs"] = {
        name: {lv: (ours[lv]["decode_tps"] / rows[lv]["decode_tps"]
                    if ours[lv]["decode_tps"] and rows[lv]["decode_tps"] else None) for lv in args.levels}
        for name, rows in out["servers"].items() if name != "ours"
    }  # fmt: skip
    return out


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="geniex-contention-") as tmp:
        srv = Server(Path(tmp), "--nctx", str(args.nctx), *args.server_arg)
        try:
            srv.wait_ready()
            kw: dict[str, Any] = {"api_key": "unused", "max_retries": 0, "timeout": args.timeout + 5}
            clients = {"ours": openai.AsyncOpenAI(base_url=f"{srv.base_url}/v1", **kw)}
            for spec in args.other:
                name, _, url = spec.partition("=")
                clients[name] = openai.AsyncOpenAI(base_url=url, **kw)
            try:
                return await measure(clients, args)
            finally:
                for c in clients.values():
                    await c.close()
        finally:
            srv.stop()


def report(res: dict[str, Any]) -> None:
    print(f"{'server':>16} {'busy':>4} {'decode tok/s':>12} {'x own idle':>10} {'TTFT ms':>9} {'timeouts':>8}")
    for name, rows in res["servers"].items():
        for level, v in rows.items():
            tps, rel, ttft = v["decode_tps"], v["vs_own_idle"], v["ttft_ms"]
            print(f"{name:>16} {level:>4} {tps or 0:>12.1f} {rel or 0:>10.2f} {ttft or 0:>9.0f} {v['timed_out']:>8}")
    for name, by_level in res["ours_vs"].items():
        print(
            f"ours / {name}: "
            + "  ".join(f"busy={lv} {r:.2f}x" if r else f"busy={lv} n/a" for lv, r in by_level.items())
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", action="append", default=[], metavar="NAME=URL",
                   help="another OpenAI-compatible server's base URL (…/v1); repeatable")  # fmt: skip
    p.add_argument(
        "--other-body",
        type=json.loads,
        default={"cache_prompt": False},
        help="JSON merged into the other servers' requests",
    )
    p.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2],
                   help="numbers of competing busy processes (default 0,1,2)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=50)
    p.add_argument("--gap", type=float, default=1.0, help="seconds of pause before each request")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds one request may take before it counts as timed out"
    )
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--nctx", type=int, default=4096)
    p.add_argument("--server-arg", action="append", default=[], help="passed to `geniex serve` (repeatable)")
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "contention.json")
    args = p.parse_args(argv)
    res = asyncio.run(amain(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    report(res)
    print(json.dumps({"servers": {n: {lv: {k: v[k] for k in ("decode_tps", "vs_own_idle", "ttft_ms")} for lv, v in rows.items()}
                                  for n, rows in res["servers"].items()}, "ours_vs": res["ours_vs"]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
