"""Keep-alives during a long prefill (`--sse-ping-interval-s`), on the real server and SmolLM2.

A prompt (~2,000 tokens on chat completions, ~330 on the other dialects) is sent through each
dialect's official client; right after the response's
headers arrive (the prompt is admitted: its prefill has begun) the worker is stopped (SIGSTOP) for
a few ping intervals, then let go. The raw stream, recorded as the client read it, holds the
dialect's keep-alive before the first token (an SSE comment on the OpenAI streams, Anthropic's
`ping` after `message_start`, a line with no text on Ollama's), and the same client still reads
it to a normal, fully counted answer. A client that leaves while only keep-alives flow cancels its
request. The stop is short of `--hang-silence-s` (15 s by default), so the worker is not judged hung.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import ollama
import openai
import pytest

from tests.conftest import MODEL
from tests.integration.test_ops import sample
from tests.server_proc import ServerProcess, serving

PING_S = 0.5
STOP_S = 3.0  # six intervals; far short of --hang-silence-s
SHORT = 20  # notes: about 330 tokens
STREAMED = ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/api/chat")


def long_prompt(name: str, notes: int = 125) -> str:
    """About 16 tokens a note (125: about 2,000 tokens), its head unique to the test so that no cached
    prefix shortens the prefill. The stopped worker makes any prompt's prefill long: the chat test
    sends the 2,000 tokens of an agent's prompt, the other dialects' a sixth of it."""
    notes = " ".join(f"Note {i}: the river runs past the old mill at dawn." for i in range(notes))
    return f"[{name}] {notes}\nIn one short sentence, what do the notes say?"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("keepalive"), "--sse-ping-interval-s", str(PING_S), "--nctx", "4096",
                 "--parallel", "1") as s:  # fmt: skip
        warm = httpx.post(f"{s.base_url}/v1/chat/completions", timeout=120,
                          json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})  # fmt: skip
        assert warm.status_code == 200, warm.text
        yield s


def worker_pid(srv: ServerProcess) -> int:
    [w] = httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"]
    return int(w["pid"])


class _Recording:
    """A response stream that keeps the bytes its reader takes."""

    def __init__(self, inner: Any, raw: bytearray) -> None:
        self.inner = inner
        self.raw = raw

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.raw += chunk
            yield chunk

    def close(self) -> None:
        self.inner.close()


class _Stopping:
    """A client's transport that stops the worker for STOP_S once a stream's headers are in, and records
    the stream's bytes as the client reads them. The openai and anthropic SDKs speak httpx2, Ollama's httpx."""

    lib: Any
    recording: type

    def __init__(self, pid: int) -> None:
        self.inner = self.lib.HTTPTransport()
        self.pid = pid
        self.raw = bytearray()

    def handle_request(self, request: Any) -> Any:
        response = self.inner.handle_request(request)
        if request.url.path in STREAMED and response.status_code == 200:
            stop(self.pid)
        return self.lib.Response(response.status_code, headers=response.headers, request=request,
                                 stream=self.recording(response.stream, self.raw), extensions=response.extensions)  # fmt: skip

    def close(self) -> None:
        self.inner.close()

    def lines(self) -> list[str]:
        return self.raw.decode().splitlines()


class _SdkRecording(_Recording, httpx2.SyncByteStream):
    pass


class SdkTransport(_Stopping, httpx2.BaseTransport):
    lib = httpx2
    recording = _SdkRecording


class _OllamaRecording(_Recording, httpx.SyncByteStream):
    pass


class OllamaTransport(_Stopping, httpx.BaseTransport):
    lib = httpx
    recording = _OllamaRecording


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(STOP_S)
    finally:
        os.kill(pid, signal.SIGCONT)


def first_index(lines: list[str], pred: Any) -> int:
    return next((i for i, line in enumerate(lines) if pred(line)), len(lines))


def sse_data(line: str) -> dict[str, Any] | None:
    return json.loads(line[len("data: ") :]) if line.startswith("data: {") else None


def test_chat_completions_sends_comments_before_its_first_token_and_the_sdk_reads_the_answer(
    srv: ServerProcess,
) -> None:
    transport = SdkTransport(worker_pid(srv))
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=120,
                           http_client=httpx2.Client(transport=transport))  # fmt: skip
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": long_prompt("chat")}], max_tokens=8, temperature=0,
        stream=True, stream_options={"include_usage": True}))  # fmt: skip
    lines = transport.lines()

    def has_content(line: str) -> bool:
        d = sse_data(line)
        return bool(d and d["choices"] and d["choices"][0]["delta"].get("content"))

    first_token = first_index(lines, has_content)
    assert first_token < len(lines), lines
    pings = [i for i, line in enumerate(lines) if line == ": keep-alive"]
    assert pings and pings[0] < first_token, lines[: first_token + 1]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens > 1500 and usage.completion_tokens > 0


def test_messages_sends_ping_events_after_message_start_and_the_sdk_reads_the_answer(srv: ServerProcess) -> None:
    transport = SdkTransport(worker_pid(srv))
    client = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120,
                                 http_client=httpx2.Client(transport=transport))  # fmt: skip
    events = list(client.messages.create(model=MODEL, max_tokens=8, stream=True,
                                         messages=[{"role": "user", "content": long_prompt("messages", SHORT)}]))  # fmt: skip
    lines = transport.lines()
    events_sent = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    assert events_sent[0] == "message_start", events_sent
    first_delta = events_sent.index("content_block_delta")
    assert "ping" in events_sent[1:first_delta], events_sent
    assert '{"type":"ping"}' in transport.raw.decode()
    types = [e.type for e in events]
    assert "ping" not in types  # the SDK skips them
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text.strip()
    [start] = [e for e in events if e.type == "message_start"]
    [end] = [e for e in events if e.type == "message_delta"]
    assert start.message.usage.input_tokens > 250 and end.usage.output_tokens > 0
    assert end.delta.stop_reason in ("end_turn", "max_tokens") and types[-1] == "message_stop"


def test_responses_sends_comments_before_its_first_token_and_the_sdk_reads_the_answer(srv: ServerProcess) -> None:
    transport = SdkTransport(worker_pid(srv))
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=120,
                           http_client=httpx2.Client(transport=transport))  # fmt: skip
    events = list(client.responses.create(model=MODEL, input=long_prompt("responses", SHORT), max_output_tokens=16,
                                          temperature=0, stream=True))  # fmt: skip
    lines = transport.lines()
    first_delta = first_index(lines, lambda line: line == "event: response.output_text.delta")
    assert first_delta < len(lines), lines
    assert ": keep-alive" in lines[:first_delta], lines[: first_delta + 1]
    done = events[-1]  # incomplete: it used its max_output_tokens
    assert done.type in ("response.completed", "response.incomplete"), [e.type for e in events]
    assert done.response.output_text.strip()
    assert done.response.usage is not None and done.response.usage.input_tokens > 250


def test_ollama_sends_empty_lines_of_its_own_shape_and_its_client_reads_the_answer(srv: ServerProcess) -> None:
    transport = OllamaTransport(worker_pid(srv))
    client = ollama.Client(host=srv.base_url, transport=transport)
    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": long_prompt("ollama", SHORT)}],
                             options={"num_predict": 8, "temperature": 0}, stream=True))  # fmt: skip
    lines = [json.loads(line) for line in transport.lines()]  # every line is JSON: no blank keep-alive
    first_token = first_index(lines, lambda d: d["message"]["content"])
    assert first_token < len(lines)
    assert any(not d["done"] and d["message"]["content"] == "" for d in lines[:first_token]), lines[: first_token + 1]
    assert "".join(p.message.content or "" for p in parts).strip()
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert (parts[-1].prompt_eval_count or 0) > 250 and (parts[-1].eval_count or 0) > 0


def cancelled(srv: ServerProcess) -> float:
    try:
        return sample(httpx.get(f"{srv.base_url}/metrics", timeout=10).text, "geniex:requests_total", model=MODEL,
                      outcome="cancelled")  # fmt: skip
    except AssertionError:  # none yet
        return 0.0


def test_a_client_leaving_while_only_keep_alives_flow_cancels_its_request(srv: ServerProcess) -> None:
    pid = worker_pid(srv)
    before = cancelled(srv)
    body = {"model": MODEL, "messages": [{"role": "user", "content": long_prompt("leaving")}], "max_tokens": 200,
            "stream": True}  # fmt: skip
    try:
        with httpx.stream("POST", f"{srv.base_url}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            os.kill(pid, signal.SIGSTOP)
            for line in r.iter_lines():  # the opening chunk, then only keep-alives: the worker is stopped
                if line == ": keep-alive":
                    break
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 30  # a bound on waiting, not a speed claim
    while any(w["inflight"] for w in httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"]):
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.1)
    assert cancelled(srv) == before + 1
    again = httpx.post(f"{srv.base_url}/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})  # fmt: skip
    assert again.status_code == 200, again.text
    assert worker_pid(srv) == pid  # the same worker: the stop was no hang
