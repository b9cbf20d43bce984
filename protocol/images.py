"""`/v1/images/generations`: the request and response bodies (OpenAI's DALL·E 3 shape), and the
bounds on the work one request may ask of a diffusion worker.

The spec's fields: `model`, `prompt` (at most 1000 characters), `n` (1..10), `size` (five sizes),
`quality`, `style`, `response_format` (only `b64_json`), `user`. GenieX extensions, absent from
OpenAI's API and optional: `num_inference_steps`, `guidance_scale`, `negative_prompt`, `seed`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

MAX_PROMPT_CHARS = 1000  # the spec's limit, for `prompt` and `negative_prompt` alike
MAX_IMAGES = 10  # `n`, as the spec allows
MAX_STEPS = 150  # `num_inference_steps`
MAX_GUIDANCE = 30.0  # `guidance_scale`: classifier-free guidance; SD's default is 7.5
# One request's work, counted in denoising steps of a 512x512 image: steps x n x (pixels / 512²).
# About 4 s per unit for SD 1.5 on two laptop cores, so 400 is under half an hour: the biggest
# request the spec's defaults allow (n 10 at 1024x1024, hd) is refused with what to lower,
# rather than occupying the worker for hours.
MAX_IMAGE_WORK = 400.0
WORK_PIXELS = 512 * 512

Size = Literal["256x256", "512x512", "1024x1024", "1792x1024", "1024x1792"]

# What `quality` and `style` mean to a diffusion model (DALL·E's own meaning is not public):
# `hd` takes twice the denoising steps; `vivid` follows the prompt harder (higher guidance).
STEPS = {"standard": 25, "hd": 50}
GUIDANCE = {"vivid": 7.5, "natural": 5.0}


class ImageGenerationRequest(msgspec.Struct, kw_only=True):
    model: str | None = None  # required by the spec; its absence is a 400 from the handler
    prompt: Annotated[str, Meta(max_length=MAX_PROMPT_CHARS)]
    n: Annotated[int, Meta(ge=1, le=MAX_IMAGES)] = 1
    size: Size = "256x256"  # the spec's default
    quality: Literal["standard", "hd"] = "standard"
    style: Literal["vivid", "natural"] = "vivid"
    # A string, not a Literal, so that "url" gets a 400 that says why rather than "invalid enum value".
    response_format: str = "b64_json"
    user: str | None = None
    # GenieX extensions (not in OpenAI's API): override what `quality` and `style` choose, steer
    # away from something, and make the images reproducible.
    num_inference_steps: Annotated[int, Meta(ge=1, le=MAX_STEPS)] | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0, le=MAX_GUIDANCE)] | None = None
    negative_prompt: Annotated[str, Meta(max_length=MAX_PROMPT_CHARS)] | None = None
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] | None = None


class ImageData(msgspec.Struct):
    b64_json: str  # a PNG, base64-encoded
    revised_prompt: str  # the prompt the image was made from: the request's own (none is rewritten)


class ImageGenerationResponse(msgspec.Struct):
    created: int
    data: list[ImageData]


def image_work(steps: int, n: int, width: int, height: int) -> float:
    """A request's work in denoising steps of a 512x512 image (see MAX_IMAGE_WORK)."""
    return steps * n * width * height / WORK_PIXELS
