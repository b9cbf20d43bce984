"""POST /v1/audio/speech: text to speech, as one WAV body or as Server-Sent Events.

The worker speaks the text a sentence at a time and sends each sentence's PCM as soon as it is
made. Not streamed, the sentences are gathered into one WAV (the stdlib `wave` module writes the
RIFF header; the sample rate is the voice's). Streamed (`stream_format: sse`), each sentence is a
`speech.audio.delta` event (base64 PCM s16le mono; the rate is in the `GenieX-Sample-Rate`
header), then `speech.audio.done` carries the usage. A client that leaves cancels the rest.

`GenieX-KeepCache: true` pins the voice's worker (keep_alive -1: loaded until evicted or
unloaded); without it the worker stays for the server's `--keep-alive-s` after its last request and
is then stopped, as every idle worker is.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import RawBody
from litestar.response import ServerSentEvent, ServerSentEventMessage

from gateway.http.auth import caller_of
from gateway.http.body import read_json
from gateway.http.dialect_stream import event
from gateway.http.disconnect import unless_disconnected
from gateway.http.headers import KEEP_CACHE_HEADER, header_true
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.http.stream_billing import FINAL, Stream, billed, error_event
from gateway.media.wav import wav
from gateway.ops.accounting import Accounting
from protocol.speech import SpeechAudioDelta, SpeechAudioDone, SpeechRequest, SpeechUsage
from protocol.wire import Audio, Done, Speak

CAPABILITY = "speech"
SAMPLE_RATE_HEADER = "GenieX-Sample-Rate"


class Tally:
    """What a request has produced so far, and its accounting, settled once."""

    def __init__(self, accounting: Accounting, characters: int) -> None:
        self.accounting = accounting
        self.characters = characters
        self.samples = 0
        self.rate = 0
        self.ids = 0

    def audio(self, msg: Audio) -> None:
        if msg.pcm and not self.samples:
            self.accounting.first_token()
        self.samples += len(msg.pcm) // 2
        self.rate = msg.sample_rate

    def done(self, msg: Done) -> None:
        self.ids = msg.prompt_tokens

    def settle(self, outcome: str) -> None:
        self.accounting.settle(outcome, self.ids, 0)

    def usage(self) -> SpeechUsage:
        seconds = round(self.samples / self.rate, 3) if self.rate else 0.0
        return SpeechUsage(input_tokens=self.ids, output_tokens=0, total_tokens=self.ids,
                           input_characters=self.characters, audio_seconds=seconds)  # fmt: skip


async def collect(stream: AsyncIterator[Audio | Done], tally: Tally) -> bytes:
    """Every sentence's PCM, in order, and the request settled."""
    chunks = []
    async for msg in stream:
        if isinstance(msg, Audio):
            tally.audio(msg)
            chunks.append(msg.pcm)
        else:
            tally.done(msg)
            tally.settle("ok")
    return b"".join(chunks)


def events(first: Audio | Done, rest: AsyncIterator[Audio | Done], tally: Tally) -> AsyncIterator[ServerSentEventMessage]:  # fmt: skip
    """A delta event per sentence, then the done event with the usage; an error after the first
    byte becomes an error event (the status has gone out)."""

    async def sentences() -> Stream[ServerSentEventMessage]:
        msg = first
        while isinstance(msg, Audio):
            tally.audio(msg)
            if msg.pcm:
                yield event(SpeechAudioDelta(audio=base64.b64encode(msg.pcm).decode("ascii")))
            msg = await anext(rest)
        tally.done(msg)
        yield FINAL
        yield event(SpeechAudioDone(usage=tally.usage()))

    return billed(sentences(), tally.settle, error_event)


@post("/v1/audio/speech", status_code=200)
async def speech(request: Request, body: RawBody, services: NamedDependency[Services]) -> Response[bytes] | ServerSentEvent:  # fmt: skip
    data = read_json(body, SpeechRequest)
    entry = services.model_for(data.model, CAPABILITY)
    keep_alive = -1.0 if header_true(request, KEEP_CACHE_HEADER) else None
    accounting = services.accounting(entry.id, caller_of(request), data.user)
    worker = await accounting.guard(services.worker(entry, keep_alive=keep_alive))
    if not data.input:  # warm-up: the voice is loaded, nothing is said (and nothing counted)
        await worker.warmup()
        return Response(content=b"null", media_type="application/json")
    message = Speak(0, current_request_id() or "", data.input, data.speed,
                    -1.0 if data.noise_scale is None else data.noise_scale,
                    -1.0 if data.noise_w is None else data.noise_w, data.voice or "")  # fmt: skip
    tally = Tally(accounting, len(data.input))
    stream = worker.speak(message)
    if data.stream_format != "sse":
        pcm = await accounting.guard(unless_disconnected(request, collect(stream, tally)), lambda: (tally.ids, 0))
        return Response(content=wav(pcm, tally.rate), media_type="audio/wav")
    # The first sentence decides the status: a refused request is a 400, not a broken stream.
    first = await accounting.guard(anext(stream))
    rate = first.sample_rate if isinstance(first, Audio) else 0
    return ServerSentEvent(events(first, stream, tally), headers={SAMPLE_RATE_HEADER: str(rate)})


handlers = [speech]
