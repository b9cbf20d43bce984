"""The NPU chat path, piece by piece, in-process: GGUF -> ONNX conversion, QNN session load with a
cold and a warm context-binary cache (the AOT compile), and a prefill chunk / decode step on QNN,
each next to a baseline of the same run (llama.cpp's load and decode of the same GGUF, the same
graph on onnxruntime's CPU EP). Also the decode step with and without IO binding (the KV buffer
bound once vs passed every step), alternating in one run, on the CPU EP (and in the simulator with
--sim-binding), and optionally the CPU EP with MatMulNBits' accuracy_level set on a copy of the graph.

    .venv/bin/python bench/npu.py [--steps 3] [--nctx 128] [--cpu-nctx 1024] [--bind-steps 40]
                                  [--sim-binding] [--accuracy-level 4] [--skip-qnn]

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


def with_accuracy_level(folder: Path, level: int, out: Path) -> Path:
    """A copy of the converted folder whose MatMulNBits nodes carry accuracy_level=`level` (the
    converter writes none: 0, the CPU EP's fp32 path); the weights files are hard-linked, not copied."""
    import onnx

    from workers.engines.npu.convert import CONFIG_FILE, DecoderConfig

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(folder / CONFIG_FILE, out / CONFIG_FILE)
    for part in DecoderConfig.load(folder).graph_parts():
        os.link(folder / part.weights, out / part.weights)  # onnxruntime refuses a symlink out of the folder
        model = onnx.load(str(folder / part.graph), load_external_data=False)
        for node in model.graph.node:
            if node.op_type == "MatMulNBits":
                kept = [a for a in node.attribute if a.name != "accuracy_level"]
                del node.attribute[:]
                node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", level)])
        onnx.save(model, str(out / part.graph))
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3, help="decode steps timed per path on QNN")
    p.add_argument("--nctx", type=int, default=128, help="the KV buffer the QNN graph attends over")
    p.add_argument("--cpu-nctx", type=int, default=1024, help="the KV buffer of the CPU EP and llama.cpp runs")
    p.add_argument("--bind-steps", type=int, default=40, help="CPU EP decode steps per path, bound and plain")
    p.add_argument("--sim-binding", action="store_true", help="simulator steps with and without IO binding")
    p.add_argument("--sim-steps", type=int, default=2, help="simulator steps per path for --sim-binding")
    p.add_argument("--accuracy-level", type=int, default=0, help="also time the CPU EP with MatMulNBits at this level")
    p.add_argument("--skip-qnn", action="store_true", help="CPU EP and llama.cpp figures only")
    args = p.parse_args()

    import llama_cpp as L
    import numpy as np
    from gguf import GGUFReader

    from gateway.models.store import bundled_models
    from workers.engines.npu.convert import DecoderConfig, cached_or_convert
    from workers.engines.npu.decoder import CHUNK, Decoder, cpu_session_factory, qnn_session_factory

    gguf = bundled_models()[0].path
    cache = Path(tempfile.mkdtemp(prefix="geniex-bench-npu-"))
    r: dict[str, float] = {}
    say = print

    folder, r["convert_s"] = timed(lambda: cached_or_convert(gguf, cache))
    llm, r["llama_load_s"] = timed(lambda: L.Llama(gguf, n_ctx=args.cpu_nctx, n_threads=2, n_threads_batch=2,
                                                   verbose=False))  # fmt: skip
    say(f"conversion {r['convert_s']:.1f}s = {r['convert_s'] / r['llama_load_s']:.0f}x llama.cpp's load "
        f"({r['llama_load_s']:.2f}s)")  # fmt: skip
    cfg = DecoderConfig.load(folder)
    graph_bytes = sum((folder / f).stat().st_size for p in cfg.graph_parts() for f in (p.graph, p.weights))
    r["parts"] = len(cfg.graph_parts())
    n_params = sum(int(t.n_elements) for t in GGUFReader(gguf).tensors)
    r["graph_mb"], r["graph_bytes_per_param"] = graph_bytes / 1e6, graph_bytes / n_params
    say(f"graph {r['graph_mb']:.1f} MB in {r['parts']:.0f} part(s) for {n_params / 1e6:.1f}M parameters: "
        f"{r['graph_bytes_per_param']:.3f} bytes/parameter (weights: {cfg.quantization}; the token table stays "
        f"in the GGUF)")  # fmt: skip

    prompt = llm.tokenize(b"The capital of France is Paris, and the capital of Italy is", add_bos=False)
    prompt = (prompt * (CHUNK // len(prompt) + 1))[:CHUNK]

    def steps(d: Decoder, n: int) -> tuple[float, float, list[int]]:
        d.reset()
        logits, prefill = timed(lambda: d.prefill(prompt))
        times, toks = [], []
        for _ in range(n):
            assert logits is not None
            toks.append(int(np.argmax(logits)))
            logits, secs = timed(lambda: d.decode(toks[-1]))
            times.append(secs)
        return prefill, statistics.median(times), toks

    def side_by_side(a: Decoder, b: Decoder, n: int) -> tuple[float, float, float, bool]:
        """Decode steps alternating a, b, b, a, a, b, ... (which goes first swaps every pair) after the
        same prefill: the medians, the median of the paired ratios a/b, and whether their logits
        agreed exactly at every step."""
        la, lb = a.prefill(prompt), b.prefill(prompt)
        ta, tb, agree = [], [], True
        for k in range(n):
            assert la is not None and lb is not None
            agree = agree and bool(np.array_equal(la, lb))
            tok = int(np.argmax(la))
            if k % 2:
                lb, sb = timed(lambda: b.decode(tok))  # noqa: B023
            la, sa = timed(lambda: a.decode(tok))  # noqa: B023
            if not k % 2:
                lb, sb = timed(lambda: b.decode(tok))  # noqa: B023
            ta.append(sa)
            tb.append(sb)
        ratio = statistics.median(x / y for x, y in zip(ta, tb, strict=True))
        return statistics.median(ta), statistics.median(tb), ratio, agree

    # ---- CPU EP: IO binding on and off, alternating; then llama.cpp on the same GGUF ----
    cpu = cpu_session_factory(2)
    bound, r["cpu_ep_load_s"] = timed(lambda: Decoder(folder, cfg, args.cpu_nctx, cpu))
    plain = Decoder(folder, cfg, args.cpu_nctx, cpu, io_binding=False)
    r["cpu_ep_prefill_s"] = timed(lambda: bound.prefill(prompt))[1]
    bound.reset()
    r["cpu_ep_step_bound_s"], r["cpu_ep_step_plain_s"], r["cpu_ep_bound_ratio"], agree = side_by_side(
        bound, plain, args.bind_steps
    )
    assert bound.bound
    say(f"CPU EP decode step, n_ctx {args.cpu_nctx}, {args.bind_steps} steps each, alternating: IO-bound "
        f"{r['cpu_ep_step_bound_s'] * 1000:.1f}ms, plain run {r['cpu_ep_step_plain_s'] * 1000:.1f}ms (median of "
        f"paired bound/plain {r['cpu_ep_bound_ratio']:.3f}; logits identical: {agree})")  # fmt: skip
    cpu_toks = steps(bound, args.steps)[2]
    del plain

    llm.reset()
    llm.eval(prompt)
    times = []
    for _ in range(args.bind_steps):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        times.append(timed(lambda: llm.eval([tok]))[1])  # noqa: B023
    r["llama_step_s"] = statistics.median(times)
    r["cpu_ep_tok_s"], r["llama_tok_s"] = 1 / r["cpu_ep_step_bound_s"], 1 / r["llama_step_s"]
    say(f"decode on 2 threads, n_ctx {args.cpu_nctx}: CPU EP (the MatMulNBits graph as converted) "
        f"{r['cpu_ep_tok_s']:.1f} tok/s, llama.cpp (same GGUF) {r['llama_tok_s']:.1f} tok/s "
        f"(CPU EP/llama.cpp step {r['cpu_ep_step_bound_s'] / r['llama_step_s']:.1f}x)")  # fmt: skip

    if args.accuracy_level:
        acc_folder = with_accuracy_level(folder, args.accuracy_level, cache / f"acc{args.accuracy_level}")
        acc = Decoder(acc_folder, DecoderConfig.load(acc_folder), args.cpu_nctx, cpu)
        bound.reset()
        r["cpu_ep_step_acc_s"], r["cpu_ep_step_acc0_s"], ratio, _ = side_by_side(acc, bound, args.bind_steps)
        say(f"CPU EP decode step with MatMulNBits accuracy_level={args.accuracy_level}: "
            f"{r['cpu_ep_step_acc_s'] * 1000:.1f}ms vs {r['cpu_ep_step_acc0_s'] * 1000:.1f}ms as converted "
            f"(paired ratio {ratio:.2f}; {1 / r['cpu_ep_step_acc_s']:.1f} tok/s)")  # fmt: skip
        del acc

    if not args.skip_qnn:
        from workers.engines.onnx import qnn_options, register_qnn

        devices = register_qnn()

        def qnn_decoder(io_binding: bool = True) -> Decoder:
            make = qnn_session_factory(devices, qnn_options(), 2, cpu_fallback=False)
            return Decoder(folder, cfg, args.nctx, make, io_binding=io_binding)

        n_sessions = 2 * int(r["parts"])
        dec, r["qnn_load_cold_s"] = timed(qnn_decoder)
        del dec
        dec, r["qnn_load_warm_s"] = timed(qnn_decoder)
        say(f"QNN load ({n_sessions} sessions, n_ctx {args.nctx}): cold (AOT compile, context binaries written) "
            f"{r['qnn_load_cold_s']:.1f}s, warm context cache {r['qnn_load_warm_s']:.1f}s "
            f"(warm/cold {r['qnn_load_warm_s'] / r['qnn_load_cold_s']:.2f})")  # fmt: skip
        small = Decoder(folder, cfg, args.nctx, cpu)
        r["qnn_prefill_s"], r["qnn_step_s"], qnn_toks = steps(dec, args.steps)
        r["cpu_ep_prefill_small_s"], r["cpu_ep_step_small_s"], _ = steps(small, args.steps)
        say(f"prefill {CHUNK} tokens, n_ctx {args.nctx}: QNN simulator {r['qnn_prefill_s']:.2f}s, CPU EP "
            f"{r['cpu_ep_prefill_small_s']:.2f}s (simulator/CPU EP "
            f"{r['qnn_prefill_s'] / r['cpu_ep_prefill_small_s']:.0f}x)")  # fmt: skip
        say(f"decode step, n_ctx {args.nctx}: QNN simulator {r['qnn_step_s']:.2f}s, CPU EP "
            f"{r['cpu_ep_step_small_s'] * 1000:.0f}ms (simulator/CPU EP "
            f"{r['qnn_step_s'] / r['cpu_ep_step_small_s']:.0f}x)")  # fmt: skip
        say(f"greedy tokens agree (QNN fp16 vs CPU EP fp32): {qnn_toks == cpu_toks[: len(qnn_toks)]}")
        if args.sim_binding:
            dec.reset()
            unbound = qnn_decoder(io_binding=False)  # warm: from the context binaries
            r["qnn_step_bound_s"], r["qnn_step_plain_s"], r["qnn_bound_ratio"], _ = side_by_side(
                dec, unbound, args.sim_steps
            )
            say(f"QNN simulator decode step, {args.sim_steps} steps each, alternating: IO-bound "
                f"{r['qnn_step_bound_s']:.2f}s (bound: {dec.bound}), plain run {r['qnn_step_plain_s']:.2f}s "
                f"(paired bound/plain {r['qnn_bound_ratio']:.3f})")  # fmt: skip
    print(json.dumps({k: round(v, 4) for k, v in r.items()}))
    shutil.rmtree(cache, ignore_errors=True)  # the graph and its context binaries
    return 0


if __name__ == "__main__":
    sys.exit(main())
