"""Mono 16-bit PCM as a WAV file: the speech route's body and the realtime session's saved audio."""

from __future__ import annotations

import io
import sys
import wave
from array import array


def wav(pcm: bytes, rate: int) -> bytes:
    """Mono 16-bit PCM (little-endian, as the wire carries it) as a WAV file."""
    if sys.byteorder == "big":  # `wave` takes samples in the machine's order
        samples = array("h", pcm)
        samples.byteswap()
        pcm = samples.tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return out.getvalue()
