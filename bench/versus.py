"""Our server against another OpenAI-compatible server, side by side, through the same SDK client.

    .venv/bin/python bench/versus.py --url http://127.0.0.1:8080/v1 [--name llama-server]

The other server is yours to start (for the performance issue: a `llama-server` built by hand
from the llama.cpp that llama-cpp-python vendors, `-m <the GGUF> -np 4 -t 2 -c 16384`); this
script starts ours (`geniex serve`, default settings) and then alternates rounds, ours, theirs,
ours, ..., so slow drift on a noisy machine hits both alike. It reports, for each server, the
median single-stream decode tok/s and TTFT, and the aggregate tok/s of 4 clients, and the
ratios ours/theirs. Same workload as bench.py (bench/README.md): greedy, 120 tokens, streamed,
`stream_options.include_usage` (a server without the usage chunk is counted by content chunks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import openai

from bench.bench import DEFAULT_MODEL, MESSAGES, concurrent, log, stream_once
from bench.launcher import Server
from bench.stats import med


async def rounds(clients: dict[str, openai.AsyncOpenAI], args: argparse.Namespace) -> dict[str, Any]:
    # Every round repeats one prompt: no server may reuse it (ours reads the same field as llama-server).
    extra = dict.fromkeys(clients, args.their_body)
    single: dict[str, list[dict[str, Any]]] = {k: [] for k in clients}
    conc: dict[str, list[dict[str, Any]]] = {k: [] for k in clients}
    for name, c in clients.items():  # warm-up: loads our model, fills caches on both
        await stream_once(c, args.model, args.max_tokens, extra_body=extra[name])
    base = None
    if args.inproc:
        from bench.bench import model_path
        from bench.inproc import Baseline, silence_llama_log

        silence_llama_log()
        base = Baseline(model_path(args.model, args.data_dir), n_ctx=args.nctx, threads=args.threads,
                        max_tokens=args.max_tokens, messages=MESSAGES)  # fmt: skip
        base.round()
        single["in-process"] = []
    for i in range(args.rounds):
        for name, c in clients.items():
            single[name].append(await stream_once(c, args.model, args.max_tokens, extra_body=extra[name]))
        if base is not None:
            single["in-process"].append(base.round())
        got = "  ".join(f"{n} {single[n][-1]['decode_tps']:.1f} tok/s" for n in single)
        log(f"single {i + 1}/{args.rounds}: {got}")
    for i in range(args.conc_rounds):
        for name, c in clients.items():
            conc[name].append(await concurrent(c, args.model, args.max_tokens, args.clients, extra_body=extra[name]))
        got = "  ".join(f"{n} {conc[n][-1]['aggregate_tps']:.1f} tok/s" for n in clients)
        log(f"{args.clients} clients {i + 1}/{args.conc_rounds}: {got}")
    out: dict[str, Any] = {}
    for name in clients:
        out[name] = {
            "decode_tps": med([x["decode_tps"] for x in single[name]]),
            "ttft_ms": med([x["ttft_ms"] for x in single[name]]),
            "tokens": med([x["tokens"] for x in single[name]]),
            f"aggregate_tps_{args.clients}": med([x["aggregate_tps"] for x in conc[name]]),
            "same_text_as_ours": single[name][0]["text"] == single["ours"][0]["text"],
        }
    if args.bare:
        from bench.bench import model_path
        from bench.inproc import lowlevel_probe, silence_llama_log

        silence_llama_log()
        probe = lowlevel_probe(model_path(args.model, args.data_dir), n_ctx=args.nctx, n_seq=args.clients,
                               threads=args.threads, prompt=list(range(100, 132)), reps=2, steps=64)  # fmt: skip
        out["bare"] = {f"aggregate_tps_{args.clients}": probe["multi_step_tps"], "probe": probe}
        log(f"bare llama.cpp, {args.clients} sequences per decode: {probe['multi_step_tps']:.1f} tok/s")
    if base is not None:
        xs = single["in-process"]
        out["in-process"] = {"decode_tps": med([x["decode_tps"] for x in xs]), "ttft_ms": med([x["ttft_ms"] for x in xs]),
                             "same_text_as_ours": xs[0]["text"] == single["ours"][0]["text"]}  # fmt: skip
        base.llm.close()
    return out


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="geniex-versus-") as tmp:
        args.data_dir = Path(tmp)
        srv = Server(args.data_dir, "--nctx", str(args.nctx), *args.server_arg)
        try:
            srv.wait_ready()
            kw = {"api_key": "unused", "max_retries": 0, "timeout": 300}
            async with openai.AsyncOpenAI(base_url=f"{srv.base_url}/v1", **kw) as ours, \
                    openai.AsyncOpenAI(base_url=args.url, **kw) as theirs:  # fmt: skip
                res = await rounds({"ours": ours, args.name: theirs}, args)
        finally:
            srv.stop()
    o, t = res["ours"], res[args.name]
    res["ratios"] = {
        "decode": o["decode_tps"] / t["decode_tps"],
        "ttft_ms_diff": o["ttft_ms"] - t["ttft_ms"],
        f"aggregate_{args.clients}": o[f"aggregate_tps_{args.clients}"] / t[f"aggregate_tps_{args.clients}"],
    }
    if "bare" in res:
        res["ratios"][f"aggregate_{args.clients}_vs_bare"] = (
            o[f"aggregate_tps_{args.clients}"] / res["bare"][f"aggregate_tps_{args.clients}"]
        )
        res["ratios"][f"{args.name}_aggregate_{args.clients}_vs_bare"] = (
            t[f"aggregate_tps_{args.clients}"] / res["bare"][f"aggregate_tps_{args.clients}"]
        )
    if "in-process" in res:
        res["ratios"]["ours_vs_inproc_decode"] = o["decode_tps"] / res["in-process"]["decode_tps"]
        res["ratios"][f"{args.name}_vs_inproc_decode"] = t["decode_tps"] / res["in-process"]["decode_tps"]
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the other server's OpenAI base URL (…/v1)")
    p.add_argument("--name", default="other")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--max-tokens", type=int, default=120)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--conc-rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--nctx", type=int, default=4096)
    p.add_argument("--inproc", action="store_true", help="also run bench.py's in-process baseline (llama-cpp-python's "
                   "Llama), single-stream rounds in the same rotation")  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=2, help="the in-process baseline's threads (match the other server's -t)"
    )
    p.add_argument("--bare", action="store_true", help="also measure bare llama.cpp decoding --clients sequences per "
                   "decode in the worker's layout: the batched ceiling")  # fmt: skip
    p.add_argument("--server-arg", action="append", default=[], help="passed to our `geniex serve` (repeatable)")
    p.add_argument("--their-body", type=json.loads, default={"cache_prompt": False},
                   help="JSON merged into their requests (default: llama-server's prompt cache off, since "
                        "ours clears a slot on admit and every round sends the same prompt)")  # fmt: skip
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "versus.json")
    args = p.parse_args(argv)
    res = asyncio.run(amain(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    for name in ("ours", args.name):
        v = res[name]
        print(f"{name:>14}: decode {v['decode_tps']:.1f} tok/s  TTFT {v['ttft_ms']:.1f} ms  "
              f"{args.clients} clients {v[f'aggregate_tps_{args.clients}']:.1f} tok/s  same text {v['same_text_as_ours']}")  # fmt: skip
    rt = res["ratios"]
    if "in-process" in res:
        v = res["in-process"]
        print(
            f"{'in-process':>14}: decode {v['decode_tps']:.1f} tok/s  TTFT {v['ttft_ms']:.1f} ms  same text {v['same_text_as_ours']}"
        )
        print(
            f"decode / in-process: ours {rt['ours_vs_inproc_decode']:.3f}x  {args.name} {rt[f'{args.name}_vs_inproc_decode']:.3f}x"
        )
    if "bare" in res:
        print(f"aggregate of {args.clients} / bare llama.cpp batched ceiling: ours "
              f"{rt[f'aggregate_{args.clients}_vs_bare']:.3f}x  {args.name} "
              f"{rt[f'{args.name}_aggregate_{args.clients}_vs_bare']:.3f}x")  # fmt: skip
    print(f"ours/{args.name}: decode {rt['decode']:.3f}x  TTFT {rt['ttft_ms_diff']:+.1f} ms  "
          f"{args.clients} clients {rt[f'aggregate_{args.clients}']:.3f}x   (JSON: {args.json})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
