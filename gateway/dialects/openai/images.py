"""POST /v1/images/generations: text to image (OpenAI's DALL·E 3 shape) on a diffusers model.

The handler checks the request and bounds its work (protocol/images.py), the worker makes the
PNGs (workers/engines/diffusion.py); a client that leaves cancels the work between two steps.
"""

from __future__ import annotations

import base64
import time

from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import RawBody

from gateway.errors import BadRequest, Unsupported
from gateway.http.auth import caller_of
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.models.store import ModelEntry
from gateway.supervisor.handle import WorkerHandle
from protocol.images import (
    GUIDANCE,
    MAX_IMAGE_WORK,
    STEPS,
    ImageData,
    ImageGenerationRequest,
    ImageGenerationResponse,
    image_work,
)
from protocol.wire import GenerateImages, Images


def to_job(data: ImageGenerationRequest) -> GenerateImages:
    """The worker's message for a request, or a BadRequest naming the field that is wrong."""
    if not data.prompt.strip():
        raise BadRequest("`prompt` must not be empty: describe the image to make")
    if data.response_format != "b64_json":
        raise BadRequest(f"`response_format`: {data.response_format!r} is not supported; only 'b64_json' "
                         "(the server keeps no image files to link to)")  # fmt: skip
    width, height = (int(v) for v in data.size.split("x"))
    steps = data.num_inference_steps or STEPS[data.quality]
    guidance = data.guidance_scale if data.guidance_scale is not None else GUIDANCE[data.style]
    work = image_work(steps, data.n, width, height)
    if work > MAX_IMAGE_WORK:
        raise BadRequest(
            f"this request is too much work for one request: {data.n} image(s) of {data.size} at {steps} steps is "
            f"{work:g} steps of a 512x512 image, and at most {MAX_IMAGE_WORK:g} are allowed; ask for fewer images, "
            "a smaller `size`, `quality` 'standard' or fewer `num_inference_steps`"
        )
    return GenerateImages(0, current_request_id() or "", data.prompt, data.n, width, height, steps, guidance,
                          negative_prompt=data.negative_prompt or "", seed=data.seed)  # fmt: skip


async def _ask(request: Request, worker: WorkerHandle, entry: ModelEntry, message: GenerateImages) -> Images:
    try:
        reply = await unless_disconnected(request, worker.call(message))
    except Unsupported as exc:
        raise Unsupported(f"`model`: {entry.id} ({entry.engine}): {exc.message}") from None
    assert isinstance(reply, Images)
    return reply


@post("/v1/images/generations", status_code=200)
async def generate_images(
    request: Request, body: RawBody, services: NamedDependency[Services]
) -> ImageGenerationResponse:
    data = read_json(body, ImageGenerationRequest)
    entry = services.model_for(data.model, "images")
    message = to_job(data)
    accounting = services.accounting(entry.id, caller_of(request), data.user)
    worker = await accounting.guard(services.worker(entry))
    reply = await accounting.guard(_ask(request, worker, entry, message))
    accounting.settle("ok", reply.prompt_tokens, 0)
    return ImageGenerationResponse(
        created=int(time.time()),
        data=[ImageData(base64.b64encode(png).decode("ascii"), reply.revised_prompt) for png in reply.png],
    )


handlers = [generate_images]
