"""/v1/logits cost per row through the gateway: full vocabulary (top_n 0) and top_n 20.

    .venv/bin/python bench/logits.py [--tokens 64] [--rounds 5]

Reports the median request time, the time per row, the response size, and how much of it
is the forward pass (the same ids with last_only: one row out, the same prefill).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx

from bench.launcher import Server

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    ids = [1 + (i * 7919) % 49000 for i in range(args.tokens)]
    srv = Server(Path(tempfile.mkdtemp(prefix="geniex-bench-")))
    try:
        srv.wait_ready()
        with httpx.Client(timeout=300) as c:
            url = f"{srv.base_url}/v1/logits"
            c.post(url, json={"model": MODEL, "input_ids": ids[:4]}).raise_for_status()  # loads the model
            for label, extra in (
                ("last_only", {"last_only": True}),
                ("top_n 20", {"top_n": 20}),
                ("full vocab", {"top_n": 0}),
            ):
                times, size = [], 0
                for _ in range(args.rounds):
                    t0 = time.perf_counter()
                    r = c.post(url, json={"model": MODEL, "input_ids": ids, **extra})
                    times.append(time.perf_counter() - t0)
                    r.raise_for_status()
                    size = len(r.content)
                rows = 1 if extra.get("last_only") else args.tokens
                med = statistics.median(times) * 1000
                print(f"{label:10s} {med:8.1f} ms  {med / rows:7.2f} ms/row  {size / 1e6:7.2f} MB  ({rows} rows)")
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
