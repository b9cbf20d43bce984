"""POST /v1/audio/diarize: who spoke when, answered by a speaker-diarization worker (senko).

The worker decodes the audio (the audio libraries live there, not in the gateway) and bounds its
length (protocol.limits.MAX_DIARIZE_SECONDS); this handler reads the audio the request carries or
names (gateway/media/inputs.py: base64, a data: URL, or a URL on an allowed host), picks the
worker, and shapes its reply. Empty audio is a warm-up: the model is loaded and the answer is null.
"""

from __future__ import annotations

from litestar import MediaType, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody

from gateway.http.auth import caller_of
from gateway.http.body import read_json
from gateway.http.disconnect import unless_disconnected
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.media.inputs import load_media
from protocol.diarize import DiarizeRequest, DiarizeResponse, DiarizeSegment
from protocol.wire import Diarization, Diarize

CAPABILITY = "diarization"


def response_of(reply: Diarization) -> DiarizeResponse:
    return DiarizeResponse(
        segments=[DiarizeSegment(t.start, t.end, t.speaker) for t in reply.turns],
        num_speakers=len({t.speaker for t in reply.turns}),
        duration=reply.duration,
    )


@post("/v1/audio/diarize", status_code=200)
async def diarize(request: Request, body: RawBody,
                  services: NamedDependency[Services]) -> Response[DiarizeResponse] | Response[bytes]:  # fmt: skip
    data = read_json(body, DiarizeRequest)
    entry = services.model_for(data.model, CAPABILITY)
    accounting = services.accounting(entry.id, caller_of(request), None)
    if not (data.audio or "").strip():  # warm-up: load the model, answer null (not counted)
        await accounting.guard(services.worker(entry, claim=False))
        return Response(content=b"null", media_type=MediaType.JSON)
    audio = await accounting.guard(load_media(data.audio or "", field="audio", limits=services.media))
    worker = await accounting.guard(services.worker(entry))
    message = Diarize(0, current_request_id() or "", audio)
    reply = await accounting.guard(unless_disconnected(request, worker.call(message)))
    assert isinstance(reply, Diarization)
    accounting.settle("ok", 0, 0)
    return Response(response_of(reply))


handlers = [diarize]
