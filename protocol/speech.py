"""`/v1/audio/speech`: the request body, the SSE events, and the bounds both sides check.

`stream_format` "sse" streams `speech.audio.delta` events (base64 of mono 16-bit little-endian
PCM at the voice's sample rate, one per sentence) and then `speech.audio.done` with the usage;
anything else is one WAV body. OpenAI calls the non-SSE format "audio"; it is accepted as "wav".
`noise_scale` and `noise_w` are GenieX extensions for Piper voices (absent: the voice's own
settings; 0 and 0: no randomness, the same audio for the same text every time).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

MAX_SPEECH_CHARS = 4096  # OpenAI's limit on `input`
MIN_SPEED, MAX_SPEED = 0.25, 4.0
MAX_NOISE = 2.0  # Piper voices use 0.333 to 0.8; far beyond, the audio is noise
MAX_VOICE_CHARS = 128

Speed = Annotated[float, Meta(ge=MIN_SPEED, le=MAX_SPEED)]
Noise = Annotated[float, Meta(ge=0.0, le=MAX_NOISE)]


class SpeechRequest(msgspec.Struct, kw_only=True):
    model: str
    input: Annotated[str, Meta(max_length=MAX_SPEECH_CHARS)]
    voice: Annotated[str, Meta(max_length=MAX_VOICE_CHARS)] | None = None
    response_format: Literal["wav"] = "wav"
    stream_format: Literal["wav", "audio", "sse"] = "wav"
    speed: Speed = 1.0
    noise_scale: Noise | None = None
    noise_w: Noise | None = None
    user: str | None = None


class SpeechUsage(msgspec.Struct):
    """`input_tokens`: the phoneme ids the voice read (its tokens); a voice makes audio, not tokens,
    so `output_tokens` is 0 and `audio_seconds` says how much it made."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_characters: int
    audio_seconds: float


class SpeechAudioDelta(msgspec.Struct, tag_field="type", tag="speech.audio.delta"):
    audio: str  # base64 of PCM s16le mono


class SpeechAudioDone(msgspec.Struct, tag_field="type", tag="speech.audio.done"):
    usage: SpeechUsage
