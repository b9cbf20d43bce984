"""POST /v1/audio/transcriptions: speech to text, one multipart request, answered whole or streamed.

Litestar parses the form: its multipart parser (the `multipart` package underneath) streams the
upload to a spooled file and stops at the server's --max-body-mb with a 413. The file's bytes go to
the worker as they are; the worker decodes them (any format FFmpeg reads), bounded in duration,
and answers with the segments. This handler checks the fields, picks the worker, and renders the
reply in the asked format.

`stream: true` (json and text; the other formats need the whole transcript) answers Server-Sent
Events as OpenAI's streamed transcription does: a `transcript.text.delta` per segment as the worker
decodes it, then `transcript.text.done` with the whole text and the usage. The worker's first
reply is awaited before the stream opens, so audio it cannot read is a plain 400, not a broken
stream; an error after that is an `error` event, and a client that leaves cancels the worker's job.

No `file` is a warm-up: the model is loaded and the answer is `null`. Usage is counted in the
ledger as seconds of audio (prompt_tokens, rounded up) and the transcript's tokens (completion_tokens);
a stream left or failed midway is counted with the segments it sent (stream_billing's rule).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import msgspec
from litestar import MediaType, Request, Response, post
from litestar.datastructures import FormMultiDict, UploadFile
from litestar.di import NamedDependency
from litestar.response import ServerSentEvent, ServerSentEventMessage

from gateway.dialects.openai import transcript_formats as formats
from gateway.errors import BadRequest, GenieXError, Unsupported
from gateway.http.auth import caller_of
from gateway.http.body import validation_error
from gateway.http.dialect_stream import event
from gateway.http.disconnect import unless_disconnected
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.http.stream_billing import FINAL, Stream, billed, error_event
from gateway.models.store import WHISPER_MODEL_ID
from gateway.ops.accounting import Accounting
from protocol.languages import WHISPER_LANGUAGES
from protocol.transcriptions import StreamUsage, TranscriptionForm, TranscriptTextDelta, TranscriptTextDone
from protocol.wire import Transcribe, Transcript, TranscriptPart, TranscriptSegment

CAPABILITY = "transcription"
# OpenAI's SDKs send a list as repeated `name[]` parts.
LIST_FIELDS = {
    "timestamp_granularities[]": "timestamp_granularities",
    "timestamp_granularities": "timestamp_granularities",
}
# Litestar adds `; charset=utf-8` to text types.
TEXT_TYPES = {"text": MediaType.TEXT, "srt": MediaType.TEXT, "vtt": "text/vtt"}
STREAMED_FORMATS = ("json", "text")

T = TypeVar("T")


class NotAForm(GenieXError):
    status = 415


async def read_form(request: Request) -> FormMultiDict:
    # gateway/http/guards.py lets JSON through to every route; this one takes a form only.
    if request.content_type[0] != "multipart/form-data":
        raise NotAForm("`Content-Type` must be multipart/form-data, with the audio as the `file` part")
    try:
        return await request.form()
    except UnicodeDecodeError:
        raise BadRequest("a form field is not UTF-8 text") from None


def split_form(form: FormMultiDict) -> tuple[TranscriptionForm, UploadFile | None]:
    """The text fields as a TranscriptionForm, and the uploaded `file` (None: a warm-up)."""
    fields: dict[str, Any] = {}
    upload: UploadFile | None = None
    for key, value in form.multi_items():
        name = LIST_FIELDS.get(key, key)
        if name == "file":
            if not isinstance(value, UploadFile):
                raise BadRequest("`file` must be a file part of the form (one with a filename), not a text field")
            if upload is not None:
                raise BadRequest("`file` is given more than once; one audio file per request")
            upload = value
        elif isinstance(value, UploadFile):
            raise BadRequest(f"`{key}` must be a text field, not a file")
        elif name in LIST_FIELDS.values():
            fields.setdefault(name, []).append(value)
        elif name in fields:
            raise BadRequest(f"`{key}` is given more than once")
        else:
            fields[name] = value
    try:
        return msgspec.convert(fields, TranscriptionForm, strict=False), upload
    except msgspec.ValidationError as exc:
        raise validation_error(exc) from None


def render(t: Transcript, response_format: str, words: bool) -> Response[bytes]:
    if response_format == "json":
        return Response(msgspec.json.encode(formats.as_json(t)), media_type=MediaType.JSON)
    if response_format == "verbose_json":
        return Response(msgspec.json.encode(formats.as_verbose(t, words)), media_type=MediaType.JSON)
    text = {"srt": formats.srt, "vtt": formats.vtt}.get(response_format, formats.text_of)(t)
    return Response(text.encode(), media_type=TEXT_TYPES[response_format])


class StreamTally:
    """What a streamed transcription has sent, and its accounting, settled once."""

    def __init__(self, accounting: Accounting) -> None:
        self.accounting = accounting
        self.seconds = 0.0  # audio transcribed so far
        self.tokens = 0
        self.texted = False

    def part(self, segment: TranscriptSegment) -> str:
        """The segment's delta. Whisper begins each segment's text with a space; the first text
        sent drops it, so that the deltas joined are the done event's (stripped) text."""
        self.accounting.first_token()
        self.seconds = max(self.seconds, segment.end)
        self.tokens += len(segment.tokens)
        text = segment.text if self.texted else segment.text.lstrip()
        self.texted = self.texted or bool(text)
        return text

    def done(self, t: Transcript) -> TranscriptTextDone:
        self.seconds, self.tokens = t.duration, sum(len(s.tokens) for s in t.segments)
        seconds = math.ceil(self.seconds)
        usage = StreamUsage(input_tokens=seconds, output_tokens=self.tokens, total_tokens=seconds + self.tokens,
                            seconds=round(t.duration, 3))  # fmt: skip
        return TranscriptTextDone(text=formats.text_of(t), usage=usage)

    def settle(self, outcome: str) -> None:
        self.accounting.settle(outcome, math.ceil(self.seconds), self.tokens)


def events(first: TranscriptPart | Transcript, rest: AsyncIterator[TranscriptPart | Transcript],
           tally: StreamTally) -> AsyncIterator[ServerSentEventMessage]:  # fmt: skip
    async def segments() -> Stream[ServerSentEventMessage]:
        msg = first
        while isinstance(msg, TranscriptPart):
            text = tally.part(msg.segment)
            if text:
                yield event(TranscriptTextDelta(delta=text))
            msg = await anext(rest)
        done = tally.done(msg)
        yield FINAL
        yield event(done)

    return billed(segments(), tally.settle, error_event)


async def _ask(request: Request, model: str, work: Awaitable[T]) -> T:
    try:
        return await unless_disconnected(request, work)
    except Unsupported as exc:
        raise Unsupported(f"`model`: {model}: {exc.message}") from None


@post("/v1/audio/transcriptions", status_code=200)
async def transcriptions(request: Request, services: NamedDependency[Services]) -> Response[bytes] | ServerSentEvent:
    form = await read_form(request)
    try:
        data, upload = split_form(form)
        if data.stream and data.response_format not in STREAMED_FORMATS:
            raise BadRequest(f"`stream`: response_format {data.response_format} comes whole; json and text stream "
                             "(leave `stream` out for srt, vtt or verbose_json)")  # fmt: skip
        entry = services.model_for(data.model, CAPABILITY, default=WHISPER_MODEL_ID)
        language = (data.language or "").strip().lower()
        if language and language not in WHISPER_LANGUAGES:
            raise BadRequest(f"`language`: {data.language!r} is not a language Whisper knows; give an ISO 639-1 "
                             "code such as 'en'")  # fmt: skip
        words = "word" in data.timestamp_granularities
        if data.timestamp_granularities and data.response_format != "verbose_json":
            raise BadRequest("`timestamp_granularities` needs `response_format` verbose_json")
        audio = await upload.read() if upload is not None else None
        if audio is not None and not audio:
            raise BadRequest("`file` is empty")

        accounting = services.accounting(entry.id, caller_of(request), None)
        worker = await accounting.guard(services.worker(entry, compute=data.compute))
        if audio is None:  # a warm-up: the model is loaded now, nothing to transcribe
            await accounting.guard(worker.warmup())
            accounting.settle("ok", 0, 0)
            return Response(b"null", media_type=MediaType.JSON)
        message = Transcribe(0, current_request_id() or "", audio, language, data.prompt or "", data.temperature, words)
        if data.stream:
            stream = worker.transcribe(message)
            first = await accounting.guard(_ask(request, entry.id, anext(stream)))
            return ServerSentEvent(events(first, stream, StreamTally(accounting)))
        reply = await accounting.guard(_ask(request, entry.id, worker.call(message)))
        assert isinstance(reply, Transcript)
        accounting.settle("ok", math.ceil(reply.duration), sum(len(s.tokens) for s in reply.segments))
        return render(reply, data.response_format, words)
    finally:
        await form.close()


handlers = [transcriptions]
