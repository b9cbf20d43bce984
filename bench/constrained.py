"""Grammar-constrained decoding speed: plain vs json_object vs json_schema vs a forced tool call,
through our server and the real SDK, greedy, one stream at a time.

    .venv/bin/python bench/constrained.py [--rounds 3] [--max-tokens 100]

The variants interleave within every round so drift in machine load hits them alike; the
report is the median decode tok/s per variant and its ratio to plain. `--stream-interval-ms 0`
keeps one chunk per token, so the client-side clock sees every token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import openai

from bench.launcher import Server

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"
ASK = [{"role": "user", "content": "Describe three software engineers as JSON: name, age and languages of each."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "languages": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "languages"]}  # fmt: skip
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "json_object": {"response_format": {"type": "json_object"}},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}},
    "forced tool call": {"tools": [{"type": "function", "function": {"name": "save", "parameters": PERSON}}],
                         "tool_choice": {"type": "function", "function": {"name": "save"}}},
}  # fmt: skip


def decode_rate(client: openai.OpenAI, max_tokens: int, **kw: Any) -> float:
    first = last = None
    tokens = 0
    for ch in client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=max_tokens, temperature=0, stream=True,
                                             stream_options={"include_usage": True}, **kw):  # fmt: skip
        delta = ch.choices[0].delta if ch.choices else None
        if delta is not None and (delta.content or delta.tool_calls):
            now = time.perf_counter()
            first = first or now
            last = now
        if ch.usage:
            tokens = ch.usage.completion_tokens
    return (tokens - 1) / (last - first) if first and last and last > first else 0.0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "constrained.json")
    args = p.parse_args()
    srv = Server(Path(tempfile.mkdtemp(prefix="geniex-bench-")), "--stream-interval-ms", "0")
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        decode_rate(client, 8)  # loads the model
        rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, kw in VARIANTS.items():
                rates[name].append(decode_rate(client, args.max_tokens, **kw))
    finally:
        srv.stop()
    plain = statistics.median(rates["plain"])
    report = {name: {"tok_s": round(statistics.median(r), 1), "ratio": round(statistics.median(r) / plain, 3), "all": r}
              for name, r in rates.items()}  # fmt: skip
    for name, r in report.items():
        print(f"{name:18s} {r['tok_s']:7.1f} tok/s  {r['ratio']:.2f}x plain")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
