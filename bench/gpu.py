"""`compute: gpu` on llama.cpp's Vulkan build (`make llama-vulkan`) against the CPU build (the
suite's venv), two real servers in the same run: prefill tok/s (prompt tokens over the time to the
first streamed token) and decode tok/s (the tokens after the first over the time after it), rounds
alternating so that a busy box slows both alike. A third column, `compute: cpu` on the Vulkan
build, checks that a CPU worker of a GPU build keeps its work off the GPU (its ratio to the CPU
build should be about 1).

    make llama-vulkan
    .venv/bin/python bench/gpu.py [--rounds 3] [--prompt-words 300] [--max-tokens 32] [--gguf PATH]

The Vulkan build's server runs under its venv's python with GGML_VK_VISIBLE_DEVICES=0 and, unless
--any-driver, VK_ICD_FILENAMES set to Mesa's lavapipe. On lavapipe, a Vulkan driver that runs on
the CPU, this measures the path (the same cores doing the work through Vulkan), not a GPU's
speed: see docs/accelerators.md for what to expect on an Adreno. Prints one line per round and a
JSON summary (medians).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.server_proc import serving

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
VULKAN_PYTHON = REPO / ".venv" / "vulkan" / "bin" / "python"


def one(base: str, model: str, compute: str, prompt: str, max_tokens: int) -> tuple[float, float, int, int]:
    """(prefill tok/s, decode tok/s, prompt tokens, completion tokens) of one streamed request."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "compute": compute,
            "cache_prompt": False}  # fmt: skip
    t0 = time.perf_counter()
    first = 0.0
    usage: dict[str, int] = {}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content") and not first:
                first = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
    end = time.perf_counter()
    p, c = usage["prompt_tokens"], usage["completion_tokens"]
    return p / (first - t0), (c - 1) / max(1e-9, end - first), p, c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-words", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--gguf", help="another GGUF (pulled into a scratch data dir as test/bench-gpu)")
    ap.add_argument("--any-driver", action="store_true", help="leave the Vulkan loader's driver choice alone")
    args = ap.parse_args()
    if not VULKAN_PYTHON.exists():
        sys.exit("no Vulkan build of llama.cpp: run `make llama-vulkan` first")
    env = {"GGML_VK_VISIBLE_DEVICES": "0"}
    if not args.any_driver:
        icd = sorted(glob.glob("/usr/share/vulkan/icd.d/lvp_icd.*.json"))
        if not icd:
            sys.exit("no lavapipe (Debian: mesa-vulkan-drivers); or pass --any-driver")
        env["VK_ICD_FILENAMES"] = icd[0]
    prompt = "Summarize this list of words: " + " ".join(f"word{i % 97}" for i in range(args.prompt_words))
    runs = {"cpu": ("cpu", "cpu"), "gpu": ("vulkan", "gpu"), "vulkan_cpu": ("vulkan", "cpu")}
    with tempfile.TemporaryDirectory() as tmp:
        model = MODEL
        datas = {build: Path(tmp) / build for build in ("cpu", "vulkan")}
        if args.gguf:
            model = "test/bench-gpu"
            for data in datas.values():
                subprocess.run([sys.executable, "-m", "gateway.cli", "pull", model, "--local", args.gguf, "--data-dir",
                                str(data)], check=True, capture_output=True)  # fmt: skip
        common = ("--nctx", "2048", "--load-timeout-s", "600")
        with (
            serving(datas["cpu"], *common) as cpu_srv,
            serving(datas["vulkan"], *common, env={**os.environ, **env}, python=str(VULKAN_PYTHON)) as vk_srv,
        ):
            servers = {"cpu": cpu_srv.base_url, "vulkan": vk_srv.base_url}
            for build, compute in runs.values():  # load every worker first: the loads are not what is measured
                one(servers[build], model, compute, "Hi", 2)
            rows = httpx.get(f"{vk_srv.base_url}/v1/workers").json()["data"]
            gpu_row = next(w for w in rows if w["compute"] == "gpu")
            device = next((d for d in gpu_row["devices"] if d["kind"] in ("gpu", "igpu")), {"description": "?"})
            print(f"gpu worker: runs_on {gpu_row['runs_on']}, {gpu_row['offloaded_layers']}/{gpu_row['n_layers']} "
                  f"layers on {device.get('name', '?')} ({device['description']})")  # fmt: skip
            results: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in runs}
            for i in range(args.rounds):
                for name in list(runs) if i % 2 == 0 else list(reversed(runs)):
                    build, compute = runs[name]
                    r = one(servers[build], model, compute, prompt, args.max_tokens)
                    results[name].append(r)
                    print(f"round {i + 1} {name}: prefill {r[0]:.1f} tok/s ({r[2]} tokens), "
                          f"decode {r[1]:.1f} tok/s ({r[3]} tokens)")  # fmt: skip
    summary: dict[str, object] = {
        unit: {"prefill_tok_s": round(statistics.median(r[0] for r in rs), 2),
               "decode_tok_s": round(statistics.median(r[1] for r in rs), 2)}
        for unit, rs in results.items()
    }  # fmt: skip
    medians = {name: summary[name] for name in runs}
    for name in ("gpu", "vulkan_cpu"):
        summary[f"{name}_over_cpu"] = {
            k: round(medians[name][k] / medians["cpu"][k], 3)  # type: ignore[index]
            for k in ("prefill_tok_s", "decode_tok_s")
        }
    summary["device"] = device.get("description", "?")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
