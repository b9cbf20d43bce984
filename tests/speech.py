"""Real speech for the transcription tests and bench: `beckett.wav` from the PyPI package
`useful-moonshine-onnx` (installed with --no-deps, found without importing it), its transcript,
and the word error rate.

The clip is Samuel Beckett's "Ever tried. Ever failed. No matter. Try again. Fail again. Fail
better." (10 s, 16 kHz mono); the Moonshine README gives its transcript as
"Ever tried ever failed, no matter try again, fail again, fail better."
"""

from __future__ import annotations

import importlib.util
import io
import re
import wave
from pathlib import Path

import av
import numpy as np

WHISPER_MODEL = "openai/whisper-tiny.en:ct2-fp16"
REFERENCE = "Ever tried ever failed, no matter try again, fail again, fail better."
SAMPLE_RATE = 16_000


def beckett_path() -> Path:
    spec = importlib.util.find_spec("moonshine_onnx")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("useful-moonshine-onnx is not installed (make install-test installs it)")
    return Path(spec.submodule_search_locations[0]) / "assets" / "beckett.wav"


def beckett_pcm() -> np.ndarray:
    """The clip's samples, int16."""
    with wave.open(str(beckett_path())) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, SAMPLE_RATE)
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def wav_bytes(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """16-bit mono WAV (or 8-bit unsigned when `samples` is uint8) of `samples`."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1 if samples.dtype == np.uint8 else 2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def repeated_beckett(times: int, gap_s: float = 20.0) -> bytes:
    """The clip `times` times with `gap_s` of silence between. With the default gap each clip
    falls in a 30-second window of its own, so every window decodes one clip: a window holding
    the same words twice reads to Whisper as a repetition loop and is decoded again and again
    at higher temperatures (its compression-ratio fallback)."""
    pcm = beckett_pcm()
    gap = np.zeros(int(gap_s * SAMPLE_RATE), dtype="<i2")
    parts = [part for _ in range(times) for part in (gap, pcm)][1:]
    return wav_bytes(np.concatenate(parts))


def words(text: str) -> list[str]:
    """Lower case, punctuation dropped (apostrophes kept), split on white space."""
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words: word-level Levenshtein."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, start=1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))


def encoded(container: str, codec: str, rate: int) -> bytes:
    """beckett.wav re-encoded by PyAV (FFmpeg's encoders): what a browser or phone would upload."""
    pcm = beckett_pcm()
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = 16_000
        for packet in (*stream.encode(frame), *stream.encode(None)):
            out.mux(packet)
    return buf.getvalue()
