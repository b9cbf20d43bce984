"""How long a /v1/logits answer of the largest allowed size holds the gateway's event loop.

    .venv/bin/python bench/logits_convert.py [--rows 42] [--rounds 5]

No server: the gateway's own conversion code on a synthetic answer (`--rows` x 49152 floats, the
whole SmolLM2 vocabulary; 42 rows is the most MAX_LOGIT_VALUES allows). Side by side, in one run:

- `one call`: the answer built as one list of rows and encoded in one call, as the gateway did
  before: the event loop (every other stream, /health) waits for all of it.
- `row by row`: gateway/dialects/openai/logits.py answer_json, run in a thread; the loop can only be held for
  one row's conversion at a time (the GIL changes hands between rows), so its stall is the
  longest single row. Reported: the total, and that longest row.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np

from gateway.dialects.openai.logits import answer_json, rows_of
from gateway.http.encoding import encode
from protocol.logits import LogitsResponse
from protocol.wire import LogitRows

VOCAB = 49152


def one_call(r: LogitRows) -> bytes:
    rows = list(rows_of(r))
    return encode(LogitsResponse(model="m", n_rows=r.n_rows, vocab_size=r.vocab_size, top_n=r.top_n, rows=rows))


def longest_row(r: LogitRows) -> float:
    worst = 0.0
    for row in rows_of(r):
        t0 = time.perf_counter()
        encode(row)
        worst = max(worst, time.perf_counter() - t0)
    return worst


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=42)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 5, args.rows * VOCAB).astype("<f4").tobytes()
    r = LogitRows(0, args.rows, VOCAB, 0, logits, b"")
    once, total, row = [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        a = one_call(r)
        once.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        b = answer_json("m", r)
        total.append(time.perf_counter() - t0)
        row.append(longest_row(r))
        assert a == b, "both ways give the same bytes"
    ms = [statistics.median(x) * 1000 for x in (once, total, row)]
    print(f"{args.rows} rows x {VOCAB} floats, {len(a) / 1e6:.1f} MB of JSON, median of {args.rounds}")
    print(f"  one call (loop held throughout):   {ms[0]:8.1f} ms")
    print(f"  row by row, total (in a thread):   {ms[1]:8.1f} ms")
    print(f"  row by row, longest loop hold:     {ms[2]:8.1f} ms  ({ms[0] / ms[2]:.0f}x shorter stall)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
