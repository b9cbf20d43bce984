"""What the hang bounds (docs/operating.md, "Hung workers") are set from, measured on this machine:
the longest a worker's heartbeat goes unheard, and how long one llama.cpp step (a 512-token prompt
chunk) takes, on an idle machine and with every core busy beside the server.

    .venv/bin/python bench/liveness.py [--rounds 3] [--prompt-words 1600]

The model is a GGUF of random weights in Llama-3.2-1B's shape (tests/npu_models.py), whose cost
per token is the real model's. "Busy" is one spinning process per core (a compiler or an indexer
beside the server). A poller reads /v1/workers every 100 ms while the worker prefills and
decodes: `heard_s_ago` (since its last message, a heartbeat at least once a second) and `step_s`
(how long its current step has run). The step time is also read from the prompt's time to first
token: (TTFT / prompt tokens) * 512.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx

from bench.kv_types import ONE_B, prompt
from bench.launcher import Server

CHUNK = 512  # workers/engines/llama/engine.py's N_BATCH: the most prompt tokens one step takes


def spin() -> None:
    while True:
        pass


def one_round(srv: Server, text: str) -> dict[str, float]:
    worst = {"heard_s_ago": 0.0, "step_s": 0.0}
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=10) as http:
            while not done.is_set():
                for w in http.get(f"{srv.base_url}/v1/workers").json()["data"]:
                    for k in worst:
                        worst[k] = max(worst[k], float(w.get(k) or 0.0))
                time.sleep(0.1)

    poller = threading.Thread(target=poll)
    poller.start()
    t0 = time.perf_counter()
    first = None
    usage: dict[str, Any] = {}
    body = {"model": ONE_B, "messages": [{"role": "user", "content": text}], "max_tokens": 16, "stream": True,
            "stream_options": {"include_usage": True}, "cache_prompt": False}  # fmt: skip
    with httpx.stream("POST", f"{srv.base_url}/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    first = time.perf_counter()
                usage = chunk.get("usage") or usage
    done.set()
    poller.join()
    ttft = (first or time.perf_counter()) - t0
    n = int(usage.get("prompt_tokens", 0))
    return {"ttft_s": round(ttft, 2), "prompt_tokens": n, "step_s_from_ttft": round(ttft / max(n, 1) * CHUNK, 2),
            "max_step_s_seen": round(worst["step_s"], 2), "max_heard_s_ago": round(worst["heard_s_ago"], 2)}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-words", type=int, default=1600)
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "liveness.json")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="geniex-liveness-"))
    from bench.kv_types import one_b_data_dirs

    data = one_b_data_dirs(tmp)["f16"]
    srv = Server(data, "--nctx", "4096")
    report: dict[str, Any] = {}
    try:
        srv.wait_ready()
        text = prompt(args.prompt_words)
        one_round(srv, "Hello")  # load
        for label in ("idle", "busy"):
            hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(multiprocessing.cpu_count())]
            for h in hogs if label == "busy" else []:
                h.start()
            try:
                rounds = [one_round(srv, text) for _ in range(args.rounds)]
            finally:
                for h in hogs:
                    if h.is_alive():
                        h.terminate()
            report[label] = {"rounds": rounds,
                             "median_step_s": statistics.median(r["step_s_from_ttft"] for r in rounds),
                             "max_step_s_seen": max(r["max_step_s_seen"] for r in rounds),
                             "max_heard_s_ago": max(r["max_heard_s_ago"] for r in rounds)}  # fmt: skip
            print(f"{label}: a {CHUNK}-token step {report[label]['median_step_s']:.2f} s (median of {args.rounds}; "
                  f"longest step seen {report[label]['max_step_s_seen']:.2f} s), longest unheard "
                  f"{report[label]['max_heard_s_ago']:.2f} s")  # fmt: skip
    finally:
        srv.stop()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
