"""`/v1/audio/transcriptions`: the form's fields and the response bodies, shaped as OpenAI's.

The request is multipart/form-data: `file` (the audio, an uploaded part) and these text fields,
converted from their strings (`"0.2"`, `"true"`) by msgspec's lax mode into TranscriptionForm.
`response_format` defaults to `text`, as the GenieX spec says (OpenAI's default is `json`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from protocol.chat import Compute
from protocol.limits import MAX_TRANSCRIPTION_PROMPT_CHARS

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
Granularity = Literal["word", "segment"]


class TranscriptionForm(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    model: str | None = None
    language: Annotated[str, Meta(max_length=16)] | None = None  # ISO 639-1, e.g. "en"
    prompt: Annotated[str, Meta(max_length=MAX_TRANSCRIPTION_PROMPT_CHARS)] | None = None
    response_format: ResponseFormat = "text"
    temperature: Annotated[float, Meta(ge=0, le=1)] = 0.0
    stream: bool = False  # true: SSE, a delta per decoded segment (json and text only; OpenAI ignores it for whisper-1)
    timestamp_granularities: list[Granularity] = []  # ["word"] adds `words` to verbose_json
    compute: Compute | None = None  # a GenieX extension, as on the other endpoints


class DurationUsage(msgspec.Struct):
    """What a transcription used: seconds of audio, as OpenAI bills whisper-1."""

    seconds: float
    type: str = "duration"


class Transcription(msgspec.Struct):
    """response_format=json."""

    text: str
    usage: DurationUsage


class Segment(msgspec.Struct):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class Word(msgspec.Struct):
    word: str
    start: float
    end: float


class TranscriptionVerbose(msgspec.Struct, omit_defaults=True):
    """response_format=verbose_json; `words` only when timestamp_granularities asks for them."""

    task: Literal["transcribe"]
    language: str  # the language's English name, as OpenAI gives it ("english")
    duration: float
    text: str
    segments: list[Segment]
    usage: DurationUsage
    words: list[Word] | None = None


class StreamUsage(msgspec.Struct, tag_field="type", tag="tokens"):
    """The done event's usage. The SDK's type for it knows only OpenAI's token usage, so it is
    that shape, with the numbers the ledger counts: seconds of audio (rounded up) as input, the
    transcript's tokens as output; `seconds` (a GenieX extension) is the json answer's duration."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    seconds: float


class TranscriptTextDelta(msgspec.Struct, tag_field="type", tag="transcript.text.delta"):
    """One decoded segment's text; the deltas joined are the done event's text."""

    delta: str


class TranscriptTextDone(msgspec.Struct, tag_field="type", tag="transcript.text.done"):
    text: str
    usage: StreamUsage
