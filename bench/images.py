"""/v1/images/generations per image through our server (the openai SDK) against the same diffusers
pipeline run in this process, in the same run, rounds alternating.

    .venv/bin/python bench/images.py [--rounds 5] [--n 2] [--steps 20] [--size 256x256] [--pipeline DIR]

Without --pipeline it builds the SYNTHETIC tiny Stable Diffusion pipeline the tests use
(tests/image_models.py: random weights, CLIP's real tokenizer; needs the test extras), so the
figure is the server's overhead on small images, where it weighs most. The in-process side does
what a Python user of diffusers would: the same pipeline class loaded the same way (float32,
safetensors, the same torch thread count and OMP_WAIT_POLICY as the worker), the same prompt,
seeds, steps and size, one image at a time, each saved as a PNG. The server adds the wire, base64
and JSON. Reports the median seconds per image on each side and their ratio (in-process time /
server time: 1.0 means no overhead; the goal is at least 0.95), and, from the worker's own log
lines, what the server adds to the worker's time per image (the same pipeline call, in the worker).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the worker sets it, before torch loads

import openai
import psutil

from bench.launcher import Server
from tests.embedding_models import geniex
from tests.image_models import MODEL, build_tiny_sd

PROMPT = "a lighthouse on a cliff at dusk, oil painting"


def in_process(pipe: Any, n: int, steps: int, width: int, height: int, seed: int) -> float:
    """Seconds for `n` PNGs made in this process, as the worker makes them."""
    import torch

    t0 = time.perf_counter()
    for i in range(n):
        image = pipe(prompt=PROMPT, num_inference_steps=steps, guidance_scale=7.5, height=height, width=width,
                     num_images_per_prompt=1, generator=torch.Generator("cpu").manual_seed(seed + i),
                     output_type="pil").images[0]  # fmt: skip
        image.save(io.BytesIO(), format="PNG")
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=2, help="images per request")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--size", default="256x256")
    p.add_argument("--pipeline", type=Path, help="a diffusers folder to use instead of the synthetic one")
    args = p.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    base = Path(tempfile.mkdtemp(prefix="geniex-bench-images-"))
    src = args.pipeline or build_tiny_sd(base / "tiny-sd")
    name = MODEL if args.pipeline is None else "bench/pipeline:default"
    geniex("pull", "--local", str(src), name, "--data-dir", str(base / "data"))

    import torch
    from diffusers import DiffusionPipeline

    threads = psutil.cpu_count(logical=False) or os.cpu_count() or 1  # the worker's default (--threads 0)
    torch.set_num_threads(threads)
    pipe = DiffusionPipeline.from_pretrained(str(src), local_files_only=True, use_safetensors=True, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)

    srv = Server(base / "data")
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=3600)
        body = {"num_inference_steps": args.steps, "guidance_scale": 7.5}
        client.images.generate(model=name, prompt=PROMPT, size=args.size, extra_body={**body, "num_inference_steps": 1})
        in_process(pipe, 1, 1, width, height, 0)  # warm both sides
        ours: list[float] = []
        theirs: list[float] = []
        ratios: list[float] = []
        for r in range(args.rounds):
            seed = 1000 + r * args.n
            t0 = time.perf_counter()
            out = client.images.generate(model=name, prompt=PROMPT, n=args.n, size=args.size,
                                         extra_body={**body, "seed": seed})  # fmt: skip
            ours.append((time.perf_counter() - t0) / args.n)
            assert out.data is not None and len(out.data) == args.n
            theirs.append(in_process(pipe, args.n, args.steps, width, height, seed) / args.n)
            ratios.append(theirs[-1] / ours[-1])
            print(f"round {r + 1}: server {ours[-1]:.3f} s/image, in-process {theirs[-1]:.3f} s/image, "
                  f"ratio {ratios[-1]:.3f}", flush=True)  # fmt: skip
        # The worker's own time per image (its "image done" log lines), for what the server adds to it.
        worker: dict[int, float] = {}
        for e in srv.events():
            if e.get("event") == "image done" and e.get("steps") == args.steps:
                worker[e["req_id"]] = worker.get(e["req_id"], 0.0) + e["seconds"] / args.n
    finally:
        srv.stop()
    s, i = statistics.median(ours), statistics.median(theirs)
    print(f"{name} {args.size} x{args.n}, {args.steps} steps, {threads} threads, {args.rounds} rounds")
    if len(worker) == len(ours):
        w = [worker[k] for k in sorted(worker)]
        added = statistics.median(o - x for o, x in zip(ours, w))
        print(
            f"the worker's own time {statistics.median(w):.3f} s/image; the server adds {added * 1000:.1f} ms/image "
            f"(median), ratio worker / client time {statistics.median(x / o for o, x in zip(ours, w)):.3f}"
        )
    print(f"server {s:.3f} s/image, in-process {i:.3f} s/image (medians); ratio in-process / server: "
          f"{i / s:.3f} of the medians, {statistics.median(ratios):.3f} median of the rounds")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
