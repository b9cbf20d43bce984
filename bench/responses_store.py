"""What `background: true` costs against the same request answered in the foreground, and what the
response store takes on disk, in one run on one server (SmolLM2, greedy).

    .venv/bin/python bench/responses_store.py [--rounds 9] [--max-tokens 64] [--stored 200]

Rounds are paired (foreground, background, foreground, ...) so drift in machine load hits both.
Foreground: `POST /v1/responses` (not streamed) until its answer is back. Background: the create,
then `GET /v1/responses/{id}` every 20 ms until it is `completed` (the poll interval bounds what
this can see; OpenAI's guide polls every 2 s). Reported per mode: the median seconds to completed,
and the gateway's CPU ms per response (psutil, the gateway process only: the store's thread and
the event log live there), and the paired ratio background / foreground.

Then `--stored` responses with `store: true` (each a short prompt, `--max-tokens` of answer) and
as many background ones (which also keep their stream events): the SQLite file's bytes (with its
-wal) per response, read from the data dir, and the rows' own bytes (what the bound counts).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
import psutil

from bench.launcher import Server

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"
ASK = "Write a long story about a dragon who learns to code."


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _foreground(http: httpx.Client, body: dict[str, Any]) -> None:
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), r.text


def _background(http: httpx.Client, body: dict[str, Any]) -> None:
    r = http.post("/v1/responses", json={**body, "background": True})
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    while True:
        got = http.get(f"/v1/responses/{rid}").json()
        if got["status"] not in ("queued", "in_progress"):
            assert got["status"] in ("completed", "incomplete"), got
            return
        time.sleep(0.02)


def _store_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in data_dir.glob("responses.sqlite3*"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stored", type=int, default=200)
    args = ap.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="geniex-bench-"))
    srv = Server(data_dir, "--nctx", "1024")
    srv.wait_ready()
    gateway = psutil.Process(srv.proc.pid)
    body = {"model": MODEL, "input": ASK, "temperature": 0, "max_output_tokens": args.max_tokens}
    out: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=srv.base_url, timeout=120) as http:
            _foreground(http, body)  # load the worker
            runs: dict[str, list[tuple[float, float]]] = {"foreground": [], "background": []}
            for _ in range(args.rounds):
                for mode, call in (("foreground", _foreground), ("background", _background)):
                    cpu0, t0 = _cpu(gateway), time.perf_counter()
                    call(http, body)
                    runs[mode].append((time.perf_counter() - t0, (_cpu(gateway) - cpu0) * 1000))
            for mode, rows in runs.items():
                out[mode] = {"median_s": round(statistics.median(s for s, _ in rows), 4),
                             "gateway_cpu_ms": round(statistics.median(c for _, c in rows), 2)}  # fmt: skip
            pairs = zip(runs["foreground"], runs["background"], strict=True)
            out["background_over_foreground"] = round(statistics.median(b[0] / f[0] for f, b in pairs), 3)
            before = _store_bytes(data_dir)
            for _ in range(args.stored):
                _foreground(http, {**body, "input": "Say hello."})
            fg_bytes = _store_bytes(data_dir)
            for _ in range(args.stored):
                _background(http, {**body, "input": "Say hello."})
            bg_bytes = _store_bytes(data_dir)
            out["store_bytes_per_response"] = round((fg_bytes - before) / args.stored)
            out["store_bytes_per_background_response"] = round((bg_bytes - fg_bytes) / args.stored)
            out["store_file_bytes"] = bg_bytes  # with the -wal, which a checkpoint folds back in
            with sqlite3.connect(data_dir / "responses.sqlite3") as db:
                rows = db.execute("SELECT events IS NOT NULL, COUNT(*), AVG(size) FROM responses GROUP BY 1").fetchall()
            out["row_bytes"] = {("background" if bg else "foreground"): round(avg) for bg, _, avg in rows}
    finally:
        srv.proc.terminate()
        srv.proc.wait(30)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
