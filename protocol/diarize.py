"""`/v1/audio/diarize`: the request and response bodies (the spec's AudioDiarizeRequest and
AudioDiarizeResponse).

`audio` is a base64 string, a `data:` URL, or an http(s) URL on a host the operator allowed
(gateway/media/inputs.py); empty or absent is a warm-up, answered `null` once the model is loaded.
"""

from __future__ import annotations

import msgspec


class DiarizeRequest(msgspec.Struct, kw_only=True):
    model: str
    audio: str | None = None  # absent, null or empty: a warm-up


class DiarizeSegment(msgspec.Struct):
    start_time: float  # seconds from the start of the audio
    end_time: float
    speaker_label: str  # "SPEAKER_01", "SPEAKER_02", ...: numbered by speaking time, longest first


class DiarizeResponse(msgspec.Struct):
    segments: list[DiarizeSegment]
    num_speakers: int
    duration: float  # seconds of audio read
