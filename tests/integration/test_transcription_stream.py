"""`stream: true` on POST /v1/audio/transcriptions against the real server and Whisper tiny.en:
a `transcript.text.delta` per decoded segment, then `transcript.text.done`, read by the openai
SDK and as raw Server-Sent Events; refused formats and unreadable audio are plain 400s; a client
that leaves mid-stream cancels the worker's job.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.server_proc import ServerProcess
from tests.speech import REFERENCE, WHISPER_MODEL, beckett_path, beckett_pcm, repeated_beckett, word_error_rate

MAX_WER = 0.1
DELTA, DONE = "transcript.text.delta", "transcript.text.done"


@pytest.fixture(scope="module")
def url(server: ServerProcess) -> Iterator[str]:
    """The route, with the model loaded once (a warm-up: a form without `file` answers null)."""
    u = f"{server.base_url}/v1/audio/transcriptions"
    r = httpx.post(u, files={"model": (None, WHISPER_MODEL)}, timeout=120)
    assert r.status_code == 200, r.text
    yield u


def form(audio: bytes, **fields: str) -> dict[str, Any]:
    return {"model": (None, WHISPER_MODEL), "file": ("clip.wav", audio, "audio/wav"),
            **{k: (None, v) for k, v in fields.items()}}  # fmt: skip


def normalised(text: str) -> str:
    return " ".join(text.split())


def usage_row(server: ServerProcess) -> dict[str, int]:
    rows = httpx.get(f"{server.base_url}/v1/usage", timeout=10).json()["data"]
    mine = [r for r in rows if r["model"] == WHISPER_MODEL]
    return {k: sum(r[k] for r in mine) for k in ("requests", "prompt_tokens", "completion_tokens")}


def whisper_inflight(server: ServerProcess) -> int:
    rows = httpx.get(f"{server.base_url}/v1/workers", timeout=10).json()["data"]
    return sum(w["inflight"] for w in rows if w["model"] == WHISPER_MODEL)


def test_the_sdk_streams_the_same_text_as_the_whole_answer(client: openai.OpenAI, server: ServerProcess,
                                                           url: str) -> None:  # fmt: skip
    audio = beckett_path().read_bytes()
    whole = client.audio.transcriptions.create(model=WHISPER_MODEL, file=("b.wav", audio), response_format="text")
    assert isinstance(whole, str)
    before = usage_row(server)
    events = list(client.audio.transcriptions.create(model=WHISPER_MODEL, file=("b.wav", audio), stream=True))
    assert [e.type for e in events[:-1]] == [DELTA] * (len(events) - 1) and len(events) >= 2
    done = events[-1]
    assert done.type == DONE
    deltas = "".join(e.delta for e in events if e.type == DELTA)
    assert normalised(deltas) == normalised(whole) == normalised(done.text), (deltas, whole, done.text)
    assert done.text == deltas.strip()
    assert word_error_rate(REFERENCE, done.text) <= MAX_WER, done.text
    # The SDK's done event takes token usage: seconds of audio (rounded up) in, the transcript's tokens out,
    # as the ledger counts them; `seconds` is the json answer's duration.
    usage = done.usage
    assert usage is not None and usage.type == "tokens"
    seconds = len(beckett_pcm()) / 16_000
    assert usage.model_extra == {"seconds": pytest.approx(seconds, abs=0.01)}
    assert usage.input_tokens == math.ceil(seconds) and usage.total_tokens == usage.input_tokens + usage.output_tokens
    after = usage_row(server)
    assert after["requests"] - before["requests"] == 1
    assert after["prompt_tokens"] - before["prompt_tokens"] == usage.input_tokens
    assert after["completion_tokens"] - before["completion_tokens"] == usage.output_tokens > 0


def test_json_streams_too(client: openai.OpenAI, url: str) -> None:
    with beckett_path().open("rb") as f:
        events = list(client.audio.transcriptions.create(model=WHISPER_MODEL, file=f, response_format="json",
                                                         stream=True))  # fmt: skip
    assert events[-1].type == DONE and word_error_rate(REFERENCE, events[-1].text) <= MAX_WER


def test_a_long_clip_arrives_segment_by_segment(url: str) -> None:
    """Raw SSE of the 40 s clip (two windows, a segment each): each event named after its type,
    and the first delta read off the socket before the done event was sent (not one burst)."""
    seen: list[tuple[int, str, dict[str, Any]]] = []  # (which read off the socket, event name, data)
    buffer = ""
    with httpx.stream("POST", url, files=form(repeated_beckett(2), stream="true"), timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for read, chunk in enumerate(r.iter_text()):
            buffer += chunk
            *blocks, buffer = buffer.replace("\r\n", "\n").split("\n\n")
            for block in blocks:
                fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
                data = json.loads(fields["data"])
                assert fields.get("event") == data["type"], block
                seen.append((read, data["type"], data))
    assert buffer.strip() == ""
    types = [t for _, t, _ in seen]
    assert types[-1] == DONE and types[:-1] == [DELTA] * (len(types) - 1)
    assert len(types) - 1 >= 2, types
    assert seen[0][0] < seen[-1][0], "the first delta came in the same read as the done event"
    done = seen[-1][2]
    assert "".join(d["delta"] for _, t, d in seen if t == DELTA).strip() == done["text"]
    assert word_error_rate(" ".join([REFERENCE] * 2), done["text"]) <= MAX_WER, done["text"]
    assert done["usage"]["seconds"] == pytest.approx(40.0, abs=0.1)


@pytest.mark.parametrize("response_format", ["srt", "vtt", "verbose_json"])
def test_formats_that_need_the_whole_transcript_do_not_stream(url: str, response_format: str) -> None:
    r = httpx.post(url, files=form(beckett_path().read_bytes(), stream="true", response_format=response_format),
                   timeout=60)  # fmt: skip
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "`stream`" in error and "json and text" in error, error


def test_unreadable_audio_is_a_400_not_a_broken_stream(server: ServerProcess, url: str) -> None:
    pids = set(server.worker_pids())
    r = httpx.post(url, files=form(b"\x00\x01not audio at all" * 100, stream="true"), timeout=60)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert "could not be decoded" in r.json()["error"], r.text
    assert pids <= set(server.worker_pids())


def test_a_client_that_leaves_mid_stream_cancels_the_job(server: ServerProcess, url: str) -> None:
    cancels = server.log().count("cancel confirmed")
    # 220 s of audio, eight windows: far from done when the client leaves after the first delta.
    with httpx.stream("POST", url, files=form(repeated_beckett(8), stream="true"), timeout=120) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["type"] == DELTA
    deadline = time.monotonic() + 60  # a bound on waiting, not a speed claim
    while whisper_inflight(server) or server.log().count("cancel confirmed") == cancels:
        assert time.monotonic() < deadline, "the worker did not drop the abandoned transcription"
        time.sleep(0.1)
    r = httpx.post(url, files=form(beckett_path().read_bytes()), timeout=120)
    assert r.status_code == 200 and word_error_rate(REFERENCE, r.text) <= MAX_WER, r.text
