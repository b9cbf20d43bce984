"""What onnxruntime's thread spinning (`--npu-spinning`) costs and buys, on the CPU EP: this box has
no NPU, so the NPU engine's decoder graph (the bundled SmolLM2 GGUF converted as the engine does,
workers/engines/npu/convert.py) runs on onnxruntime's CPU EP with 2 intra-op threads, its sessions'
intra-op and inter-op pools spinning or not (workers/engines/onnx.py allow_spinning), nothing else
different.

    .venv/bin/python bench/npu_spinning.py [--steps 32] [--rounds 6] [--nctx 128] [--busy 0,1]
                                           [--accuracy-level 4] [--model 1b] [--cache DIR]

Each setting has a process of its own (so one's spinning threads never bill the other's CPU time),
both loaded before any round; rounds alternate between them (off, on, on, off, ...: who goes first
swaps every pair), each round `--steps` greedy decode steps after an untimed prefill. Per step: the
wall time (median), and the process's CPU time (all its threads: time.process_time over the round,
per step). The ratios on/off are the median of the paired rounds'. `--busy N`: the same with N
processes spinning a CPU loop beside it (a laptop is never idle: a browser, an indexer, a build).

On a Snapdragon the graph runs on the NPU and the pool's threads have little to do, so there the
spin is nearly all waste (microsoft/Foundry-Local#1081: 62-66 % of 12 cores against 9-14 %); here
the threads compute, so this measures the lower bound of that cost and what spinning buys a CPU
that works between its waits. `--accuracy-level 4` (int8 activations, a copy of the graph,
bench/npu.py) gives shorter steps, nearer an NPU's; `--model 1b`: a random GGUF in Llama-3.2-1B's
shape (tests/npu_models.py; a longer conversion and far longer steps).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

PROMPT = list(range(100, 132))  # token ids: the timing does not depend on the text (CHUNK tokens: one prefill)
SETTLE_S = 0.3  # between rounds: a spinning pool left behind by the last round has gone to sleep


def spin_forever() -> None:
    while True:
        pass


def decoder_process(conn: Connection, folder: str, nctx: int, threads: int, spinning: bool) -> None:
    """One setting's decoder: loads, warms up, then runs a round for each "round" it is sent."""
    import numpy as np

    from workers.engines.npu.convert import DecoderConfig
    from workers.engines.npu.decoder import Decoder, cpu_session_factory

    cfg = DecoderConfig.load(Path(folder))
    dec = Decoder(Path(folder), cfg, nctx, cpu_session_factory(threads, spinning))
    dec.prefill(PROMPT)  # warm-up: the first runs allocate
    conn.send("ready")
    while (steps := conn.recv()) is not None:
        dec.reset()
        logits = dec.prefill(PROMPT)
        walls: list[float] = []
        cpu0 = time.process_time()
        for _ in range(steps):
            assert logits is not None
            t0 = time.perf_counter()
            logits = dec.decode(int(np.argmax(logits)))
            walls.append(time.perf_counter() - t0)
        conn.send({"wall_ms": 1000 * statistics.median(walls), "cpu_ms": 1000 * (time.process_time() - cpu0) / steps})


def start_decoder(ctx: Any, folder: Path, args: argparse.Namespace, spinning: bool) -> tuple[Any, Connection]:
    here, there = ctx.Pipe()
    proc = ctx.Process(target=decoder_process, args=(there, str(folder), args.nctx, args.threads, spinning))
    proc.start()
    there.close()  # the child's end: a child that dies makes recv raise EOFError instead of waiting forever
    assert here.recv() == "ready"
    return proc, here


def paired_rounds(conns: dict[bool, Connection], args: argparse.Namespace) -> dict[str, float]:
    """`args.rounds` rounds per setting, alternating off/on, on/off, ...; medians and paired ratios."""
    rounds: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for k in range(args.rounds):
        for spinning in (False, True) if k % 2 == 0 else (True, False):
            time.sleep(SETTLE_S)
            conns[spinning].send(args.steps)
            rounds[spinning].append(conns[spinning].recv())
    out: dict[str, float] = {}
    for key in ("wall_ms", "cpu_ms"):
        off, on = [r[key] for r in rounds[False]], [r[key] for r in rounds[True]]
        out[f"off_{key}"], out[f"on_{key}"] = statistics.median(off), statistics.median(on)
        out[f"{key}_ratio"] = statistics.median(b / a for a, b in zip(off, on, strict=True))
    return out


def one_condition(ctx: Any, folder: Path, args: argparse.Namespace, busy: int) -> dict[str, float]:
    spinners = [ctx.Process(target=spin_forever, daemon=True) for _ in range(busy)]
    for p in spinners:
        p.start()
    decoders = {spinning: start_decoder(ctx, folder, args, spinning) for spinning in (False, True)}
    try:
        return paired_rounds({s: conn for s, (_, conn) in decoders.items()}, args)
    finally:
        for proc, conn in decoders.values():
            conn.send(None)
            proc.join(timeout=30)
        for p in spinners:
            p.terminate()
            p.join()


def graph(args: argparse.Namespace, cache: Path) -> Path:
    """The converted decoder folder (reused from `cache` when it is there), as the engine makes it."""
    from gateway.models.store import bundled_models
    from workers.engines.npu.convert import cached_or_convert

    if args.model == "1b":
        from tests.npu_models import llama_shaped_gguf

        gguf = cache / "llama-1b-shape.gguf"
        if not gguf.exists():
            llama_shaped_gguf(gguf)
        source = str(gguf)
    else:
        source = bundled_models()[0].path
    folder = cached_or_convert(source, cache)
    if args.accuracy_level:
        from bench.npu import with_accuracy_level

        acc = cache / f"acc{args.accuracy_level}-{folder.name}"
        folder = acc if acc.exists() else with_accuracy_level(folder, args.accuracy_level, acc)
    return folder


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=32, help="decode steps per round")
    p.add_argument("--rounds", type=int, default=6, help="rounds per setting and condition, alternated")
    p.add_argument("--nctx", type=int, default=128, help="the KV buffer the graph attends over")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (the NPU engine's default)")
    p.add_argument("--busy", default="0,1", help="busy CPU loops beside the decoders, one condition per number")
    p.add_argument("--accuracy-level", type=int, default=0, help="MatMulNBits accuracy_level on a copy (4: int8)")
    p.add_argument("--model", choices=("smollm2", "1b"), default="smollm2")
    p.add_argument("--cache", type=Path, default=None, help="keep (and reuse) the converted graph here")
    args = p.parse_args()
    if len(PROMPT) + args.steps > args.nctx:
        p.error(f"--steps {args.steps} after a {len(PROMPT)}-token prompt overflow --nctx {args.nctx}")

    cache = args.cache or Path(tempfile.mkdtemp(prefix="geniex-bench-spin-"))
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    folder = graph(args, cache)
    print(f"graph {folder} ready in {time.perf_counter() - t0:.1f} s", flush=True)
    ctx = mp.get_context("spawn")  # fresh processes: nothing of onnxruntime's inherited
    results: dict[str, dict[str, float]] = {}
    for busy in (int(n) for n in args.busy.split(",")):
        r = results[f"busy{busy}"] = one_condition(ctx, folder, args, busy)
        print(f"{busy} busy loop(s): per step, spinning off / on: wall {r['off_wall_ms']:.1f} / {r['on_wall_ms']:.1f} "
              f"ms (paired on/off {r['wall_ms_ratio']:.3f}), process CPU {r['off_cpu_ms']:.1f} / {r['on_cpu_ms']:.1f} "
              f"ms (paired on/off {r['cpu_ms_ratio']:.3f})", flush=True)  # fmt: skip
    print(json.dumps({k: {m: round(v, 3) for m, v in r.items()} for k, r in results.items()}))
    if args.cache is None:
        shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
