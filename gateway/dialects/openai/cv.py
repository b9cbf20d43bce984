"""POST /v1/cv: computer vision on one image; with an OCR model, the lines of text it holds.

The handler reads the image's bytes (base64, a `data:` URL, or a URL on a host the operator
allowed), picks the worker, and shapes its answer; the worker decodes the image, within its
bounds, and runs the model. Usage: one request is one image (the ledger's request count), and the
characters read are counted as completion tokens (there is no prompt).
"""

from __future__ import annotations

from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import RawBody

from gateway.errors import Unsupported
from gateway.http.auth import caller_of
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.media.inputs import load_media
from protocol.cv import BBox, CVRequest, CVResponse, CVResult
from protocol.wire import Recognize, TextRegions

CAPABILITY = "ocr"


def results(reply: TextRegions) -> list[CVResult]:
    return [CVResult(label=r.text, confidence=r.confidence, bbox=BBox(x=r.x, y=r.y, width=r.width, height=r.height))
            for r in reply.regions]  # fmt: skip


@post("/v1/cv", status_code=200)
async def cv(request: Request, body: RawBody, services: NamedDependency[Services]) -> CVResponse:
    data = read_json(body, CVRequest)
    entry = services.model_for(data.model, CAPABILITY)
    image = await load_media(data.image, field="image", limits=services.media)
    accounting = services.accounting(entry.id, caller_of(request), data.user)
    worker = await accounting.guard(services.worker(entry, compute=data.compute))
    message = Recognize(0, current_request_id() or "", image)
    try:
        reply = await accounting.guard(unless_disconnected(request, worker.call(message)))
    except Unsupported as exc:
        raise Unsupported(f"`model`: {entry.id} ({entry.engine}): {exc.message}") from None
    assert isinstance(reply, TextRegions)
    accounting.settle("ok", 0, sum(len(r.text) for r in reply.regions))
    return CVResponse(results=results(reply))


handlers = [cv]
