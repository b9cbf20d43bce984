"""The NPU chat path, piece by piece, in-process: GGUF -> ONNX conversion, QNN session load with a
cold and a warm context-binary cache, and a prefill chunk / decode step on QNN, each next to a
baseline of the same run (llama.cpp's load and decode of the same GGUF, the same graph on
onnxruntime's CPU EP).

    .venv/bin/python bench/npu.py [--steps 3] [--nctx 128]

On x86_64 QNN's HTP backend is Qualcomm's simulator (enabled here), so its times say how slow the
simulator is, not how fast an NPU is: see docs/accelerators.md, "Chat on the NPU", for what to expect on a
Snapdragon. Prints one line per figure and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("GENIEX_QNN_SIMULATOR", "1")


def timed(fn):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3, help="decode steps timed per path")
    p.add_argument("--nctx", type=int, default=128, help="the KV buffer the graph attends over")
    args = p.parse_args()

    import llama_cpp as L
    import numpy as np
    from gguf import GGUFReader

    from gateway.models.store import bundled_models
    from workers.engines.npu.convert import DecoderConfig, cached_or_convert
    from workers.engines.npu.decoder import CHUNK, Decoder, cpu_session_factory, qnn_session_factory
    from workers.engines.onnx import qnn_options, register_qnn

    gguf = bundled_models()[0].path
    cache = Path(tempfile.mkdtemp(prefix="geniex-bench-npu-"))
    r: dict[str, float] = {}
    say = print

    folder, r["convert_s"] = timed(lambda: cached_or_convert(gguf, cache))
    llm, r["llama_load_s"] = timed(lambda: L.Llama(gguf, n_ctx=args.nctx, verbose=False))
    say(f"conversion {r['convert_s']:.1f}s = {r['convert_s'] / r['llama_load_s']:.0f}x llama.cpp's load "
        f"({r['llama_load_s']:.2f}s)")  # fmt: skip
    cfg = DecoderConfig.load(folder)
    graph_bytes = sum((folder / f).stat().st_size for p in cfg.graph_parts() for f in (p.graph, p.weights))
    r["parts"] = len(cfg.graph_parts())
    n_params = sum(int(t.n_elements) for t in GGUFReader(gguf).tensors)
    r["graph_mb"], r["graph_bytes_per_param"] = graph_bytes / 1e6, graph_bytes / n_params
    say(f"graph {r['graph_mb']:.1f} MB for {n_params / 1e6:.1f}M parameters: {r['graph_bytes_per_param']:.3f} "
        f"bytes/parameter (weights: {cfg.quantization}; the token table stays in the GGUF)")  # fmt: skip
    devices = register_qnn()

    def qnn_decoder() -> Decoder:
        return Decoder(folder, cfg, args.nctx, qnn_session_factory(devices, qnn_options(), 2, cpu_fallback=False))

    dec, r["qnn_load_cold_s"] = timed(qnn_decoder)
    del dec
    dec, r["qnn_load_warm_s"] = timed(qnn_decoder)
    say(f"QNN load (2 sessions): cold {r['qnn_load_cold_s']:.1f}s, warm context cache {r['qnn_load_warm_s']:.1f}s "
        f"(warm/cold {r['qnn_load_warm_s'] / r['qnn_load_cold_s']:.2f})")  # fmt: skip
    cpu, r["cpu_ep_load_s"] = timed(lambda: Decoder(folder, cfg, args.nctx, cpu_session_factory(2)))

    prompt = llm.tokenize(b"The capital of France is Paris, and the capital of Italy is", add_bos=False)
    prompt = (prompt * (CHUNK // len(prompt) + 1))[:CHUNK]

    def steps(d: Decoder) -> tuple[float, float, list[int]]:
        d.reset()
        logits, prefill = timed(lambda: d.prefill(prompt))
        times, toks = [], []
        for _ in range(args.steps):
            assert logits is not None
            toks.append(int(np.argmax(logits)))
            logits, secs = timed(lambda: d.decode(toks[-1]))
            times.append(secs)
        return prefill, statistics.median(times), toks

    r["qnn_prefill_s"], r["qnn_step_s"], qnn_toks = steps(dec)
    r["cpu_ep_prefill_s"], r["cpu_ep_step_s"], cpu_toks = steps(cpu)
    llm.reset()
    llm.eval(prompt)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    r["llama_step_s"] = (time.perf_counter() - t0) / args.steps
    say(f"prefill {CHUNK} tokens: QNN simulator {r['qnn_prefill_s']:.2f}s, CPU EP {r['cpu_ep_prefill_s']:.2f}s "
        f"(simulator/CPU EP {r['qnn_prefill_s'] / r['cpu_ep_prefill_s']:.0f}x)")  # fmt: skip
    say(f"decode step: QNN simulator {r['qnn_step_s']:.2f}s, CPU EP {r['cpu_ep_step_s'] * 1000:.0f}ms, llama.cpp "
        f"{r['llama_step_s'] * 1000:.0f}ms (simulator/llama.cpp {r['qnn_step_s'] / r['llama_step_s']:.0f}x, "
        f"CPU EP/llama.cpp {r['cpu_ep_step_s'] / r['llama_step_s']:.1f}x)")  # fmt: skip
    say(f"greedy tokens agree (QNN fp16 vs CPU EP fp32): {qnn_toks == cpu_toks}")
    print(json.dumps({k: round(v, 4) for k, v in r.items()}))
    shutil.rmtree(cache, ignore_errors=True)  # the graph and its context binaries
    return 0


if __name__ == "__main__":
    sys.exit(main())
