"""Streaming through our server to an upstream, against talking to the upstream directly.

    .venv/bin/python bench/upstream.py [--rounds 5] [--max-tokens 120] [--clients 4] [--pace-ms 5] [--json PATH]

Starts two upstreams, `geniex serve` (the bundled SmolLM2) and bench/paced_upstream.py (a stand-in
streaming a chunk every --pace-ms, computing nothing), and our `geniex serve`, where both are
registered with `geniex pull --upstream` (engine "upstream"). For each upstream, rounds alternate,
direct then through us, so the drift of a noisy machine hits both alike: bench.py's workload
(greedy, streamed, `stream_options.include_usage`), then --clients concurrent streams.

Reported per upstream: median single-stream decode tok/s, end-to-end tok/s (tokens over send to
last byte) and TTFT of each, the aggregate tok/s of the concurrent streams, and the ratios
us/direct (goal: decode >= 0.97). The paced stand-in's ratios are the relay's own cost; the
real upstream's also carry its decode speed drifting with the machine's load. Also: the resident
memory of our upstream workers (what the pool's estimate for such a worker stands on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
import openai

from bench.bench import DEFAULT_MODEL, concurrent, log, stream_once
from bench.launcher import Server, free_port
from bench.stats import med

VIA = "remote/smollm"
PACED = "remote/paced"


async def rounds(direct: openai.AsyncOpenAI, via: openai.AsyncOpenAI, args: argparse.Namespace,
                 models: tuple[str, str] = (DEFAULT_MODEL, VIA)) -> dict[str, Any]:  # fmt: skip
    clients = {"direct": (direct, models[0]), "via_us": (via, models[1])}
    # Every request repeats one prompt, and both reach the same upstream with its prompt cache on
    # (our upstream engine does not forward GenieX's own `cache_prompt`): alike for both.
    extra = None
    for c, model in clients.values():  # warm-up: loads the upstream's model and our upstream worker
        await stream_once(c, model, args.max_tokens, extra_body=extra)
    single: dict[str, list[dict[str, Any]]] = {k: [] for k in clients}
    conc: dict[str, list[dict[str, Any]]] = {k: [] for k in clients}
    for i in range(args.rounds):
        for name, (c, model) in clients.items():
            single[name].append(await stream_once(c, model, args.max_tokens, extra_body=extra))
        log(
            f"single {i + 1}/{args.rounds}: "
            + "  ".join(f"{n} {single[n][-1]['decode_tps']:.1f} tok/s" for n in single)
        )
    for i in range(args.conc_rounds):
        for name, (c, model) in clients.items():
            conc[name].append(await concurrent(c, model, args.max_tokens, args.clients, extra_body=extra))
        log(f"{args.clients} clients {i + 1}/{args.conc_rounds}: "
            + "  ".join(f"{n} {conc[n][-1]['aggregate_tps']:.1f} tok/s" for n in conc))  # fmt: skip
    out: dict[str, Any] = {}
    for name in clients:
        out[name] = {
            "decode_tps": med([x["decode_tps"] for x in single[name]]),
            "ttft_ms": med([x["ttft_ms"] for x in single[name]]),
            # Tokens over the whole request, send to last byte: what a client waits, relay latency included.
            "e2e_tps": med([x["tokens"] / x["total_s"] for x in single[name]]),
            "tokens": med([x["tokens"] for x in single[name]]),
            f"aggregate_tps_{args.clients}": med([x["aggregate_tps"] for x in conc[name]]),
            "same_text_as_direct": single[name][0]["text"] == single["direct"][0]["text"],
        }
    return out


async def measure(up_url: str, ours: Server, args: argparse.Namespace, models: tuple[str, str]) -> dict[str, Any]:
    kw: dict[str, Any] = {"api_key": "unused", "max_retries": 0, "timeout": 300}
    async with openai.AsyncOpenAI(base_url=up_url, **kw) as direct, \
            openai.AsyncOpenAI(base_url=f"{ours.base_url}/v1", **kw) as via:  # fmt: skip
        return await rounds(direct, via, args, models)


def ratios(res: dict[str, Any], clients: int) -> dict[str, float]:
    d, v = res["direct"], res["via_us"]
    return {
        "decode": v["decode_tps"] / d["decode_tps"],
        "e2e": v["e2e_tps"] / d["e2e_tps"],
        "ttft_ms_diff": v["ttft_ms"] - d["ttft_ms"],
        f"aggregate_{clients}": v[f"aggregate_tps_{clients}"] / d[f"aggregate_tps_{clients}"],
    }


def pull(ours_dir: Path, name: str, url: str, model: str) -> None:
    subprocess.run([sys.executable, "-m", "gateway.cli", "pull", name, "--upstream", url, "--upstream-model", model,
                    "--data-dir", str(ours_dir)], check=True, cwd=REPO, capture_output=True)  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="geniex-upstream-bench-") as tmp:
        up = Server(Path(tmp) / "upstream", "--nctx", str(args.nctx), *args.upstream_arg)
        paced_port = free_port()
        paced = subprocess.Popen([sys.executable, str(REPO / "bench" / "paced_upstream.py"), "--port", str(paced_port),
                                  "--pace-ms", str(args.pace_ms)])  # fmt: skip
        paced_url = f"http://127.0.0.1:{paced_port}/v1"
        ours_dir = Path(tmp) / "ours"
        res: dict[str, Any] = {}
        try:
            up.wait_ready()
            pull(ours_dir, VIA, f"{up.base_url}/v1", DEFAULT_MODEL)
            pull(ours_dir, PACED, paced_url, "paced")
            ours = Server(ours_dir)
            try:
                ours.wait_ready()
                if args.pace_ms > 0:
                    log(f"a stand-in upstream streaming a chunk every {args.pace_ms:g} ms (the relay's own cost)")
                    res["paced"] = asyncio.run(measure(paced_url, ours, args, ("paced", PACED)))
                    res["paced"]["ratios"] = ratios(res["paced"], args.clients)
                log("a real GenieX upstream decoding SmolLM2")
                res["geniex"] = asyncio.run(measure(f"{up.base_url}/v1", ours, args, (DEFAULT_MODEL, VIA)))
                res["geniex"]["ratios"] = ratios(res["geniex"], args.clients)
                rows = httpx.get(f"{ours.base_url}/v1/workers", timeout=10).json()["data"]
                res["upstream_worker_rss_mib"] = [round((w["rss_bytes"] or 0) / 2**20, 1) for w in rows
                                                  if w["engine"] == "upstream"]  # fmt: skip
            finally:
                ours.stop()
        finally:
            paced.terminate()
            paced.wait()
            up.stop()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=120)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--conc-rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--nctx", type=int, default=4096)
    p.add_argument("--pace-ms", type=float, default=5.0,
                   help="the stand-in upstream's ms between chunks (0: skip that part)")  # fmt: skip
    p.add_argument("--upstream-arg", action="append", default=[],
                   help="passed to the upstream's `geniex serve` (repeatable; e.g. --upstream-arg=--threads)")  # fmt: skip
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    res = run(args)
    text = json.dumps(res, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
