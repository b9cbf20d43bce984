"""KV cache types (`--cache-type-k`/`-v`): the context they buy and what they cost in decode speed.

    .venv/bin/python bench/kv_types.py [--rounds 4] [--tokens 48] [--no-1b]

For each model, one server per KV type (f16, q8_0, q4_0; K and V alike), all three up at once,
each with its model preloaded:

- bytes per token as the worker reports them (`/v1/workers` kv_bytes_per_token), and from them the
  largest context one worker holds in 2 GiB of KV (2 GiB // bytes per token);
- the worker's resident memory after its load, against f16's: its cache of `--nctx` × `--parallel`
  tokens is allocated (and cleared, so resident) as the context is made, so the difference is
  the KV's, which the bytes per token predict;
- decode tokens per second, one stream: a prompt of `--prompt-words` words (the 1B shape's:
  `--prompt-words-1b`), then `--tokens` greedy tokens with the end tokens banned, a chunk per token
  (`--stream-interval-ms 0`); the rate is (tokens - 1) / (last token - first token). The types take
  turns within each round, in an order that rotates, and the medians over the rounds are compared
  with f16's of the same run.

The models: SmolLM2-135M (the bundled model: 30 layers, 3 KV heads of 64) and, unless `--no-1b`,
a GGUF of random weights in Llama-3.2-1B's shape (16 layers, 8 KV heads of 64, Q4_0;
tests/npu_models.py llama_shaped_gguf with the bundled tokenizer), written to a temporary folder.
One JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
import openai

from bench.bench import DEFAULT_MODEL, log
from bench.launcher import Server

TYPES = ("f16", "q8_0", "q4_0")
KV_BUDGET = 2 << 30  # 2 GiB
NO_END = {"0": -100, "2": -100}  # SmolLM2's end-of-generation tokens (the 1B shape has its tokenizer)
ONE_B = "local/llama-1b-shape"  # the model id it is pulled as


def prompt(words: int) -> str:
    story = " ".join(f"On day {i} the keeper of the lighthouse wrote down the weather, the ships and the birds."
                     for i in range(1, words // 16 + 1))  # fmt: skip
    return f"{story}\nContinue the keeper's diary for the next days, in the same style."


def worker(srv: Server, model: str) -> dict[str, Any]:
    rows = httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"]
    return next(w for w in rows if w["model"].split(":")[0] == model.split(":")[0])


def decode_rate(client: openai.OpenAI, model: str, text: str, tokens: int) -> float:
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, logit_bias=NO_END,  # type: ignore[arg-type]
    )  # fmt: skip
    first = last = None
    generated = 0
    for chunk in stream:
        if chunk.usage is not None:
            generated = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
    if first is None or last is None or generated < 2 or last <= first:
        raise RuntimeError(f"{model}: {generated} tokens, nothing to time")
    return (generated - 1) / (last - first)


def run_model(label: str, model: str, data_dirs: dict[str, Path], args: argparse.Namespace, flags: list[str],
              words: int) -> dict[str, Any]:  # fmt: skip
    servers = {t: Server(data_dirs[t], "--cache-type-k", t, "--cache-type-v", t, "--preload", model,
                         "--stream-interval-ms", "0", "--cache-ram-mb", "0", *flags) for t in TYPES}  # fmt: skip
    try:
        for srv in servers.values():
            srv.wait_ready(timeout=300)
        info = {t: worker(srv, model) for t, srv in servers.items()}
        out: dict[str, Any] = {"model": label, "flags": flags, "prompt_words": words, "types": {}}
        for t in TYPES:
            w = info[t]
            per_token = w["kv_bytes_per_token"]
            out["types"][t] = {
                "kv_bytes_per_token": per_token,
                "ctx_in_2gib": KV_BUDGET // per_token,
                "worker_rss_mb": round(w["rss_bytes"] / 2**20),
                "kv_tokens": w["nctx"] * w["parallel"],
            }
        base = out["types"]["f16"]
        for t in TYPES:
            row = out["types"][t]
            row["rss_saved_mb"] = base["worker_rss_mb"] - row["worker_rss_mb"]
            row["kv_saved_mb_predicted"] = round(
                (base["kv_bytes_per_token"] - row["kv_bytes_per_token"]) * row["kv_tokens"] / 2**20
            )
        text = prompt(words)
        clients = {t: openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0, timeout=600)
                   for t, s in servers.items()}  # fmt: skip
        for t in TYPES:  # the prompt's prefill, once per server (later rounds reuse it from the slot)
            decode_rate(clients[t], model, text, 2)
        rates: dict[str, list[float]] = {t: [] for t in TYPES}
        for r in range(args.rounds):
            order = TYPES[r % len(TYPES) :] + TYPES[: r % len(TYPES)]
            for t in order:
                rates[t].append(decode_rate(clients[t], model, text, args.tokens))
            log(f"{label} round {r + 1}: " + ", ".join(f"{t} {rates[t][-1]:.1f}" for t in TYPES) + " tok/s")
        for t in TYPES:
            median = statistics.median(rates[t])
            out["types"][t]["decode_tok_s"] = round(median, 2)
            out["types"][t]["decode_vs_f16"] = round(median / statistics.median(rates["f16"]), 3)
            out["types"][t]["decode_runs"] = [round(x, 2) for x in rates[t]]
        return out
    finally:
        for srv in servers.values():
            srv.stop()


def one_b_data_dirs(tmp: Path) -> dict[str, Path]:
    """The 1B-shaped GGUF, written once and imported into each server's data dir."""
    from tests.npu_models import llama_shaped_gguf

    t0 = time.perf_counter()
    path = llama_shaped_gguf(tmp / "llama-1b-shape.gguf", tokenizer=True)
    log(f"1B-shaped GGUF written in {time.perf_counter() - t0:.1f} s ({Path(path).stat().st_size >> 20} MiB)")
    dirs = {}
    for t in TYPES:
        dirs[t] = tmp / f"data-1b-{t}"
        subprocess.run([sys.executable, "-m", "gateway.cli", "pull", "--local", path, ONE_B, "--data-dir",
                        str(dirs[t])], check=True, capture_output=True, cwd=REPO)  # fmt: skip
    return dirs


def report(result: dict[str, Any]) -> None:
    print(f"\n{result['model']} ({' '.join(result['flags'])})")
    print(f"{'type':6} {'B/token':>8} {'ctx in 2 GiB':>13} {'RSS MiB':>8} {'saved':>6} {'predicted':>9} "
          f"{'decode tok/s':>13} {'vs f16':>7}")  # fmt: skip
    for t, row in result["types"].items():
        print(f"{t:6} {row['kv_bytes_per_token']:>8} {row['ctx_in_2gib']:>13,} {row['worker_rss_mb']:>8} "
              f"{row['rss_saved_mb']:>6} {row['kv_saved_mb_predicted']:>9} {row['decode_tok_s']:>13} "
              f"{row['decode_vs_f16']:>7}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48, help="tokens timed per request")
    ap.add_argument("--prompt-words", type=int, default=1000, help="SmolLM2's prompt")
    ap.add_argument("--prompt-words-1b", type=int, default=300, help="the 1B shape's (its prefill is slower)")
    ap.add_argument("--no-1b", action="store_true", help="SmolLM2 only")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="geniex-kv-") as tmp_name:
        tmp = Path(tmp_name)
        small = {t: tmp / f"data-smollm2-{t}" for t in TYPES}
        results.append(run_model("SmolLM2-135M", DEFAULT_MODEL, small, args, ["--nctx", "8192", "--parallel", "4"],
                                 args.prompt_words))  # fmt: skip
        report(results[-1])
        if not args.no_1b:
            one_b = run_model("Llama-3.2-1B shape, random Q4_0 weights", ONE_B, one_b_data_dirs(tmp), args,
                              ["--nctx", "16384", "--parallel", "1"], args.prompt_words_1b)  # fmt: skip
            results.append(one_b)
            report(one_b)
    print(json.dumps({"bench": "kv_types", "rounds": args.rounds, "tokens": args.tokens, "results": results}))


if __name__ == "__main__":
    main()
