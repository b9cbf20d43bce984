"""The person at the keyboard while a background agent prefills: an interactive client's TTFT and
decode rate, with request priority on and off, paired in the same run.

    .venv/bin/python bench/priority.py [--rounds 4] [--no-1b] [--asks 4]

One server per model (`geniex serve --parallel 2`), the bundled SmolLM2-135M and a random-weight
GGUF of Llama-3.2-1B's shape (tests/npu_models.py llama_shaped_gguf: its cost per token). Each round
runs two phases, `on` and `off`, in an order that swaps every round:

- a background client sends long prompts one after another (each with a fresh first line, so no
  prompt cache helps it; 16 tokens of answer: it is mostly prefill), with `GenieX-Priority:
  background` when on, no header when off;
- once its first prompt is being prefilled, the interactive client asks `--asks` short questions,
  one after another (`GenieX-Priority: interactive` when on), each streamed, greedy, 32 tokens;
- the phase ends when the interactive client is done and the background request running then has
  finished.

Reported per model and phase: the interactive median TTFT and decode tok/s, the background
client's median seconds per request, and on / off ratios. Nothing here asserts a speed. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import openai

from bench.bench import DEFAULT_MODEL, log
from bench.kv_types import NO_END, ONE_B, prompt
from bench.launcher import Server

HEADER = "GenieX-Priority"
QUESTION = [{"role": "user", "content": "Name three colours of the sea."}]


async def interactive_once(client: openai.AsyncOpenAI, model: str, tokens: int) -> dict[str, float | None]:
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(model=model, messages=QUESTION, max_tokens=tokens,  # type: ignore[arg-type]
                                                  temperature=0, stream=True, logit_bias=NO_END,  # type: ignore[arg-type]
                                                  stream_options={"include_usage": True})  # fmt: skip
    arrivals = []
    generated = 0
    async for chunk in stream:
        if chunk.usage is not None:
            generated = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())
    if not arrivals:
        return {"ttft_ms": None, "decode_tps": None}
    span = arrivals[-1] - arrivals[0]
    # Tokens, not chunks: the server coalesces a few tokens per chunk (--stream-interval-ms).
    return {"ttft_ms": (arrivals[0] - t0) * 1000,
            "decode_tps": (generated - 1) / span if generated > 1 and span > 0 else None}  # fmt: skip


async def background_loop(client: openai.AsyncOpenAI, model: str, words: int, stop: asyncio.Event,
                          started: asyncio.Event, seconds: list[float]) -> None:  # fmt: skip
    async with client:
        await _background(client, model, words, stop, started, seconds)


async def _background(client: openai.AsyncOpenAI, model: str, words: int, stop: asyncio.Event,
                      started: asyncio.Event, seconds: list[float]) -> None:  # fmt: skip
    text = prompt(words)
    while not stop.is_set():
        nonce = f"Agent task {uuid.uuid4().hex}.\n"  # a prompt no cache holds
        t0 = time.perf_counter()
        task = asyncio.create_task(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": nonce + text}], max_tokens=16, temperature=0))  # fmt: skip
        await asyncio.sleep(0.3)  # its prefill is under way
        started.set()
        await task
        seconds.append(time.perf_counter() - t0)


async def phase(srv: Server, model: str, on: bool, args: argparse.Namespace, words: int) -> dict[str, Any]:
    def client(priority: str) -> openai.AsyncOpenAI:
        headers = {HEADER: priority} if on else {}
        return openai.AsyncOpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=900,
                                  default_headers=headers)  # fmt: skip

    stop, started = asyncio.Event(), asyncio.Event()
    bg_seconds: list[float] = []
    bg = asyncio.create_task(background_loop(client("background"), model, words, stop, started, bg_seconds))
    await started.wait()
    asks = []
    person = client("interactive")
    for _ in range(args.asks):
        asks.append(await interactive_once(person, model, args.tokens))
        await asyncio.sleep(0.2)
    stop.set()
    await bg
    await person.close()
    ttfts = [a["ttft_ms"] for a in asks if a["ttft_ms"] is not None]
    rates = [a["decode_tps"] for a in asks if a["decode_tps"] is not None]
    return {"ttft_ms": statistics.median(ttfts) if ttfts else None,
            "decode_tps": statistics.median(rates) if rates else None,
            "background_s": statistics.median(bg_seconds) if bg_seconds else None,
            "background_requests": len(bg_seconds)}  # fmt: skip


def run_model(label: str, model: str, data_dir: Path, args: argparse.Namespace, words: int) -> dict[str, Any]:
    srv = Server(data_dir, "--parallel", "2")
    try:
        srv.wait_ready(120)
        warm = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=900)
        warm.chat.completions.create(model=model, messages=QUESTION, max_tokens=2)  # type: ignore[arg-type]
        rounds: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
        for r in range(args.rounds):
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                got = asyncio.run(phase(srv, model, mode == "on", args, words))
                rounds[mode].append(got)
                log(f"{label} round {r + 1} {mode}: TTFT {got['ttft_ms']:.0f} ms, decode {got['decode_tps'] or 0:.1f} "
                    f"tok/s, background {got['background_s'] or 0:.2f} s/request")  # fmt: skip
        out: dict[str, Any] = {"model": label, "rounds": rounds}
        for key in ("ttft_ms", "decode_tps", "background_s"):
            med = {m: statistics.median(x[key] for x in rounds[m] if x[key] is not None) for m in rounds}
            out[key] = {m: round(v, 2) for m, v in med.items()}
            out[key]["on_over_off"] = round(med["on"] / med["off"], 3) if med["off"] else None
        return out
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--asks", type=int, default=4, help="interactive questions per phase")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per interactive answer")
    ap.add_argument("--background-words", type=int, default=1500, help="SmolLM2's background prompt")
    ap.add_argument("--background-words-1b", type=int, default=500, help="the 1B shape's (its prefill is slower)")
    ap.add_argument("--no-1b", action="store_true", help="SmolLM2 only")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="geniex-priority-") as tmp_name:
        tmp = Path(tmp_name)
        results.append(run_model("SmolLM2-135M", DEFAULT_MODEL, tmp / "data", args, args.background_words))
        if not args.no_1b:
            from tests.npu_models import llama_shaped_gguf

            path = llama_shaped_gguf(tmp / "llama-1b-shape.gguf", tokenizer=True)
            data = tmp / "data-1b"
            subprocess.run([sys.executable, "-m", "gateway.cli", "pull", "--local", str(path), ONE_B, "--data-dir",
                            str(data)], check=True, capture_output=True, cwd=REPO)  # fmt: skip
            results.append(run_model("Llama-3.2-1B shape, random Q4_0", ONE_B, data, args, args.background_words_1b))
    for res in results:
        print(f"\n{res['model']}")
        for key, unit in (("ttft_ms", "ms"), ("decode_tps", "tok/s"), ("background_s", "s/request")):
            v = res[key]
            print(f"  {key:14} on {v['on']:>9} {unit:9} off {v['off']:>9} {unit:9} on/off {v['on_over_off']}")
    print(json.dumps({"priority": results}))


if __name__ == "__main__":
    main()
