"""Speculative decoding: decode speed with and without it, through our server and the real SDK.

    .venv/bin/python bench/speculative.py              # 3 rounds, 200 tokens (a few minutes on 2 cores)
    .venv/bin/python bench/speculative.py --rounds 1   # smoke run

Greedy, one stream at a time, on prompts that invite copying (a code edit, a list
to repeat) and one that does not (a story), the variants interleaved within every round so that drift in machine
load hits them all alike. Reports the median decode tok/s per variant, its ratio
to no speculation, the draft acceptance rate (accepted / drafted) and whether the
output equals the unspeculated one. The draft-simple variant drafts SmolLM2 with
SmolLM2 itself: the draft costs as much as the target, so it shows the machinery
and the acceptance ceiling, not a speedup.

"same output" can read NO without a bug: this llama.cpp CPU build computes a
sequence's logits slightly differently when its decode holds one token than when
it holds several (measured up to ~1.3 logits apart; every multi-token decode
agrees with every other). Verification decodes several tokens, so at a near-tie
the greedy pick can differ from a lone 1-token-per-step run, exactly as it does
when a second request shares the decode under plain continuous batching.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import openai

from bench.bench import Guard, busy_processes
from bench.launcher import Server
from bench.stats import med

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"

CODE = '''def summarize(x):
    """Return basic statistics of the numbers in x."""
    if not x:
        return None
    n = len(x)
    total = 0
    smallest = x[0]
    largest = x[0]
    for v in x:
        total += v
        if v < smallest:
            smallest = v
        if v > largest:
            largest = v
    mean = total / n
    squares = 0
    for v in x:
        squares += (v - mean) ** 2
    variance = squares / n
    ordered = sorted(x)
    if n % 2 == 1:
        median = ordered[n // 2]
    else:
        median = (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return {
        "count": n,
        "mean": mean,
        "median": median,
        "min": smallest,
        "max": largest,
        "variance": variance,
    }'''

PROMPTS: dict[str, list[dict[str, str]]] = {
    "code-edit": [
        {"role": "system", "content": "You are a coding assistant."},
        {
            "role": "user",
            "content": f"Here is a Python function:\n\n```python\n{CODE}\n```\n\n"
            "Repeat it exactly, renaming variable x to y.",
        },
    ],
    "repeat-list": [
        {"role": "system", "content": "You copy text exactly."},
        {"role": "user", "content": "Copy this text: " + ", ".join(["apple", "banana", "cherry"] * 12)},
    ],
    # Little to copy: what speculation costs when its drafts are mostly wrong.
    "story": [
        {"role": "system", "content": "You are a storyteller."},
        {"role": "user", "content": "Write a long story about a dragon who learns to code."},
    ],
}

VARIANTS: dict[str, dict[str, Any]] = {
    "none": {},
    "ngram-simple": {"spec_type": "ngram-simple"},
    "ngram-map-k": {"spec_type": "ngram-map-k"},
    "ngram-simple n8": {"spec_type": "ngram-simple", "spec_n_max": 8},
    "ngram-map-k n8": {"spec_type": "ngram-map-k", "spec_n_max": 8},
    "draft-simple (self)": {"spec_type": "draft-simple", "spec_draft_model": MODEL},
}


def log(msg: str) -> None:
    print(f"[speculative] {msg}", file=sys.stderr, flush=True)


async def once(
    client: openai.AsyncOpenAI, messages: list[dict[str, str]], spec: dict[str, Any], max_tokens: int
) -> dict[str, Any]:
    arrivals: list[float] = []
    parts: list[str] = []
    usage = None
    stream = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0,  # type: ignore[arg-type]
        stream=True, stream_options={"include_usage": True}, extra_body=spec,
    )  # fmt: skip
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())
            parts.append(chunk.choices[0].delta.content)
    tokens = usage.completion_tokens if usage else len(arrivals)
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    details = usage.completion_tokens_details if usage else None
    return {
        "decode_tps": (tokens - 1) / span if span > 0 else None,
        "tokens": tokens,
        "accepted": (details.accepted_prediction_tokens or 0) if details else 0,
        "rejected": (details.rejected_prediction_tokens or 0) if details else 0,
        "text": "".join(parts),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, dict[str, list[dict[str, Any]]]] = {p: {v: [] for v in VARIANTS} for p in PROMPTS}
    guard = Guard(args.idle_wait)
    with tempfile.TemporaryDirectory(prefix="geniex-spec-bench-") as tmp:
        srv = Server(Path(tmp) / "data", "--nctx", str(args.nctx))
        try:
            srv.wait_ready()
            async with openai.AsyncOpenAI(
                base_url=f"{srv.base_url}/v1", api_key="bench", max_retries=0, timeout=600
            ) as c:
                for spec in VARIANTS.values():  # load the model and the draft, warm the caches
                    await once(c, PROMPTS["repeat-list"], spec, 8)
                for k in range(args.rounds):
                    for prompt, messages in PROMPTS.items():
                        for name, spec in VARIANTS.items():
                            res = await guard.run(f"{prompt}/{name} round {k + 1}",
                                                  lambda m=messages, s=spec: once(c, m, s, args.max_tokens))  # fmt: skip
                            results[prompt][name].append(res)
                            log(f"round {k + 1} {prompt:11} {name:20} {res['decode_tps'] or 0:7.1f} tok/s "
                                f"{res['tokens']:4} tokens, accepted {res['accepted']}, rejected {res['rejected']}")  # fmt: skip
        finally:
            srv.stop()
    return {"results": results, "contended": guard.contended, "redone": guard.redone}


def table(report: dict[str, Any]) -> str:
    lines = []
    for prompt, by_variant in report["results"].items():
        base_tps = med([r["decode_tps"] for r in by_variant["none"]])
        base_text = by_variant["none"][0]["text"] if by_variant["none"] else None
        lines.append(f"\n{prompt}")
        lines.append(
            f"  {'variant':20} {'tok/s':>7} {'ratio':>6} {'accept':>7} {'acc/step':>8} {'tokens':>6}  same output"
        )
        for name, runs in by_variant.items():
            tps = med([r["decode_tps"] for r in runs])
            acc = sum(r["accepted"] for r in runs)
            drafted = acc + sum(r["rejected"] for r in runs)
            toks = sum(r["tokens"] for r in runs)
            # Tokens per target decode: each step emits 1 token plus the accepted draft tokens.
            per_step = toks / max(toks - acc, 1)
            ratio = f"{tps / base_tps:.2f}x" if tps and base_tps else "-"
            rate = f"{acc / drafted:.0%}" if drafted else "-"
            same = all(r["text"] == base_text for r in runs)
            lines.append(f"  {name:20} {tps or 0:7.1f} {ratio:>6} {rate:>7} {per_step:8.2f} "
                         f"{round(toks / max(len(runs), 1)):6}  {'yes' if same else 'NO'}")  # fmt: skip
    lines.append("\nsame output: vs the 'none' run; see the module docstring for why a NO need not be a bug")
    if report["contended"]:
        lines.append(f"\ncontended rounds (other processes used the CPU): {', '.join(report['contended'])}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--nctx", type=int, default=2048)
    ap.add_argument("--idle-wait", type=float, default=60.0, help="seconds to wait for an idle machine before a redo")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    if busy := busy_processes():
        log(f"other busy processes at start: {', '.join(busy)}")
    report = asyncio.run(run(args))
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
