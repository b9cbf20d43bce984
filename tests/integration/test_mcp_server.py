"""GenieX as an MCP server (`/mcp`), on the real server, its real models (SmolLM2, Whisper tiny.en,
the Piper voice, MiniLM) and the official `mcp` SDK's client over Streamable HTTP, both protocol
eras: the 2026-07-28 one (the client's `auto`) and the initialize handshake (`legacy`).

The shared session server serves the read-mostly tests; one server of this module's own has API
keys, an embedding model and a small --max-body-mb, and is drained at the end.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import re
import signal
import threading
import time
import wave
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from mcp import Client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import MODEL
from tests.embedding_models import ONNX_MODEL, data_dir_with_models
from tests.server_proc import ServerProcess, serving
from tests.speech import REFERENCE, WHISPER_MODEL, beckett_path, word_error_rate

TOOLS = {"chat", "embed", "transcribe", "speak", "list_models"}
VOICE = "rhasspy/piper-en_US-joe:medium"
KEY = "sk-mcp-server-0123456789abcdef"
LABEL = "mcp-desktop"
HASTY = "sk-mcp-hasty-0123456789abcdef"  # its requests have a deadline of 1 s (the key file's timeout=1)
SEQUENCE = "Continue the sequence: 1, 2, 3, 4,"  # wide greedy margins (../shared/MODELS.md)
LONG = "Write a very long story about a dragon who learns to code."


@contextlib.asynccontextmanager
async def connect(url: str, key: str | None = None, mode: str = "auto") -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with create_mcp_http_client(headers=headers) as http:
        from mcp.client.streamable_http import streamable_http_client

        async with Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as client:
            yield client


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


def counter(srv: ServerProcess, name: str, **labels: str) -> float:
    """A Prometheus counter's value for exactly these labels (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in httpx.get(f"{srv.base_url}/metrics", timeout=10).text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


@pytest.fixture(scope="module")
def url(server: ServerProcess) -> str:
    return f"{server.base_url}/mcp"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """API keys (one, labelled), MiniLM installed, and 1 MiB bodies; drained by the last test."""
    data = data_dir_with_models(tmp_path_factory.getbasetemp() / "embedding-models")
    keys = tmp_path_factory.mktemp("mcp-server-keys") / "keys"
    keys.write_text(f"{KEY} {LABEL}\n{HASTY} hasty timeout=1\n")
    with serving(data, "--api-key-file", str(keys), "--max-body-mb", "1", "--nctx", "1024",
                 "--drain-timeout-s", "60") as srv:  # fmt: skip
        yield srv


# ------------------------------------------------------------------ the shared server, no keys


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_client_lists_the_tools_and_chat_answers_as_the_chat_route_does(
    url: str, client: openai.OpenAI, mode: str
) -> None:
    async with connect(url, mode=mode) as mcp:
        listed = (await mcp.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        for tool in listed:
            assert tool.input_schema["type"] == "object" and tool.output_schema is not None, tool.name
            assert tool.description and tool.annotations is not None and tool.annotations.read_only_hint
        chat = next(t for t in listed if t.name == "chat")
        assert chat.input_schema["properties"]["max_tokens"]["minimum"] == 1
        result = await mcp.call_tool("chat", {"prompt": SEQUENCE, "max_tokens": 8, "temperature": 0})
    assert not result.is_error, text_of(result)
    answer = result.structured_content
    assert answer is not None and answer["model"] == MODEL
    assert 1 <= answer["usage"]["completion_tokens"] <= 8 and answer["usage"]["prompt_tokens"] > 0
    assert text_of(result) == answer["text"] and answer["text"].strip()
    # The same request through /v1/chat/completions: the same plan, the same worker, the same greedy answer.
    same = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": SEQUENCE}],
                                          max_tokens=8, temperature=0)  # fmt: skip
    assert same.choices[0].message.content == answer["text"]
    assert same.usage is not None and same.usage.prompt_tokens == answer["usage"]["prompt_tokens"]


async def test_messages_and_a_system_prompt_reach_the_model_and_the_call_is_counted(
    url: str, server: ServerProcess
) -> None:
    before = counter(server, "geniex:mcp_server_calls_total", tool="chat", outcome="ok")
    requests = counter(server, "geniex:requests_total", model=MODEL, outcome="ok")
    messages = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": SEQUENCE}]  # fmt: skip
    async with connect(url) as mcp:
        result = await mcp.call_tool("chat", {"messages": messages, "system": "You are terse.", "max_tokens": 4,
                                              "temperature": 0})  # fmt: skip
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    # the system prompt and three turns: more prompt than the one turn above
    assert result.structured_content["usage"]["prompt_tokens"] > 20
    assert counter(server, "geniex:mcp_server_calls_total", tool="chat", outcome="ok") == before + 1
    assert counter(server, "geniex:requests_total", model=MODEL, outcome="ok") == requests + 1


async def test_spoken_text_comes_back_as_wav_audio_that_whisper_reads_back(url: str) -> None:
    said = "The weather today is sunny and warm. Please bring a hat and some water."
    async with connect(url) as mcp:
        spoken = await mcp.call_tool("speak", {"text": said})
        assert not spoken.is_error, text_of(spoken)
        (audio,) = [c for c in spoken.content if c.type == "audio"]
        assert audio.mime_type == "audio/wav"
        clip = base64.b64decode(audio.data)
        with wave.open(io.BytesIO(clip)) as w:
            assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
            rate, seconds = w.getframerate(), w.getnframes() / w.getframerate()
        facts = spoken.structured_content
        assert facts is not None and facts["model"] == VOICE
        assert facts["sample_rate"] == rate and facts["audio_seconds"] == pytest.approx(seconds, abs=0.01)
        assert seconds > 2 and facts["usage"]["prompt_tokens"] > len(said) // 2  # phoneme ids
        heard = await mcp.call_tool("transcribe", {"audio": audio.data, "language": "en"})
    assert not heard.is_error, text_of(heard)
    assert word_error_rate(said, text_of(heard)) <= 0.25, text_of(heard)
    assert heard.structured_content is not None and heard.structured_content["model"] == WHISPER_MODEL


async def test_real_speech_as_a_data_url_is_transcribed(url: str) -> None:
    clip = base64.b64encode(beckett_path().read_bytes()).decode()
    async with connect(url) as mcp:
        result = await mcp.call_tool("transcribe", {"audio": f"data:audio/wav;base64,{clip}"})
    assert not result.is_error, text_of(result)
    assert word_error_rate(REFERENCE, text_of(result)) <= 0.1, text_of(result)
    facts = result.structured_content
    assert facts is not None and facts["language"] == "en" and facts["duration_s"] == pytest.approx(10, abs=0.5)
    assert facts["usage"]["prompt_tokens"] == math.ceil(facts["duration_s"])  # seconds, as the route bills them


async def test_list_models_shows_each_model_its_tools_and_each_tools_default(url: str) -> None:
    async with connect(url) as mcp:
        everything = (await mcp.call_tool("list_models", {})).structured_content
        voices = (await mcp.call_tool("list_models", {"capability": "speech"})).structured_content
    assert everything is not None and voices is not None
    models = {m["id"]: m for m in everything["models"]}
    assert "chat" in models[MODEL]["capabilities"] and models[MODEL]["tools"] == ["chat"]
    assert models[WHISPER_MODEL]["tools"] == ["transcribe"] and models[VOICE]["tools"] == ["speak"]
    assert everything["defaults"] == {"chat": MODEL, "embed": None, "transcribe": WHISPER_MODEL, "speak": VOICE}
    assert [m["id"] for m in voices["models"]] == [VOICE]


HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("chat", {"prompt": 5}, "`prompt`: Expected `str`"),
    ("chat", {}, "`prompt` or `messages` is required"),
    ("chat", {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, "not both"),
    ("chat", {"prompt": "  "}, "`prompt` is empty"),
    ("chat", {"messages": []}, "`messages` is empty"),
    ("chat", {"messages": [{"role": "robot", "content": "hi"}]}, "`messages[0].role`"),
    ("chat", {"messages": [{"role": "user"}]}, "`messages[0].content`: a required argument is missing"),
    ("chat", {"prompt": "hi", "max_tokens": 2**40}, "`max_tokens`"),
    ("chat", {"prompt": "hi", "max_tokens": 0}, "`max_tokens`"),
    ("chat", {"prompt": "hi", "temperature": 9}, "`temperature`"),
    ("chat", {"prompt": "hi", "stream": True}, "unknown field `stream`"),
    ("chat", {"prompt": "hi", "model": "nobody/nothing"}, "geniex pull nobody/nothing"),
    ("chat", {"prompt": "hi", "model": WHISPER_MODEL}, "does not support chat"),
    ("chat", {"prompt": "word " * 20_000}, "the prompt is 100000 characters"),  # more than --nctx 2048 holds
    ("embed", {"texts": []}, "`texts`"),
    ("embed", {"texts": ["a", ""]}, "`texts[1]`"),
    ("embed", {"texts": "food"}, "`texts`: Expected `array`"),
    ("embed", {"texts": ["food"]}, "no installed model can embed"),  # none on this server: what to pull
    ("embed", {"texts": ["food"], "model": MODEL}, "does not support embeddings"),
    ("transcribe", {}, "`audio`: a required argument is missing"),
    ("transcribe", {"audio": ""}, "`audio` is empty"),
    ("transcribe", {"audio": "not base64 at all!"}, "`audio` is neither valid base64"),
    ("transcribe", {"audio": "https://example.com/a.wav"}, "`audio` must be the file itself"),
    ("transcribe", {"audio": "UklGRg==", "language": "klingon"}, "`language`"),
    ("transcribe", {"audio": "UklGRg==", "model": VOICE}, "does not support transcription"),
    ("speak", {"text": ""}, "`text`"),
    ("speak", {"text": "x" * 4097}, "`text`"),
    ("speak", {"text": "hi", "speed": 10}, "`speed`"),
    ("speak", {"text": "hi", "model": MODEL}, "does not support speech"),
    ("list_models", {"capability": 3}, "`capability`"),
]


async def test_hostile_arguments_are_tool_errors_naming_the_argument_and_the_server_keeps_serving(
    url: str, server: ServerProcess
) -> None:
    errors = counter(server, "geniex:mcp_server_calls_total", tool="chat", outcome="error")
    async with connect(url) as mcp:
        for tool, args, why in HOSTILE:
            result = await mcp.call_tool(tool, args)
            assert result.is_error, (tool, args)
            assert why in text_of(result), (tool, args, text_of(result))
        # audio no decoder reads: the worker refuses it, and stays up
        noise = base64.b64encode(b"definitely not audio " * 64).decode()
        refused = await mcp.call_tool("transcribe", {"audio": noise})
        assert refused.is_error and text_of(refused)
        with pytest.raises(MCPError, match="unknown tool 'rm_rf'"):
            await mcp.call_tool("rm_rf", {})
        after = await mcp.call_tool("chat", {"prompt": SEQUENCE, "max_tokens": 2, "temperature": 0})
        assert not after.is_error, text_of(after)
    chat_errors = sum(1 for tool, _, _ in HOSTILE if tool == "chat")
    assert counter(server, "geniex:mcp_server_calls_total", tool="chat", outcome="error") == errors + chat_errors


def test_only_post_is_served_and_a_foreign_page_is_refused(url: str, server: ServerProcess) -> None:
    got = httpx.get(url, headers={"Accept": "text/event-stream"}, timeout=10)
    assert got.status_code == 405 and got.headers["allow"] == "POST" and "POST" in got.json()["error"]
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    foreign = httpx.post(url, json=ping, headers={**accept, "Origin": "https://evil.example"}, timeout=10)
    assert foreign.status_code == 403 and "evil.example" in foreign.json()["error"]
    own = httpx.post(url, json=ping, headers={**accept, "Origin": server.base_url}, timeout=10)
    assert own.status_code == 200, own.text  # this server's own page (its web UI) may
    rebinding = httpx.post(url, json=ping, headers={**accept, "Host": "attacker.example"}, timeout=10)
    assert rebinding.status_code == 403


# ------------------------------------------------------------------ a server with keys


def test_a_client_without_the_key_gets_401_and_the_usual_error_body(keyed: ServerProcess) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    accept = {"Accept": "application/json, text/event-stream"}
    for headers in ({}, {"Authorization": "Bearer sk-wrong-key-0000000000"}):
        r = httpx.post(f"{keyed.base_url}/mcp", json=init, headers={**accept, **headers}, timeout=10)
        assert r.status_code == 401 and "API key" in r.json()["error"], r.text
        assert r.headers["www-authenticate"].startswith("Bearer")


async def test_the_sdk_client_is_refused_without_the_key_and_served_with_it(keyed: ServerProcess) -> None:
    # The SDK reads the 401 (the test above checks its body) as an error answer, raised from its task group.
    with pytest.raises(BaseExceptionGroup) as refused:
        async with connect(f"{keyed.base_url}/mcp", mode="legacy") as mcp:
            await mcp.list_tools()
    assert refused.group_contains(MCPError, depth=None), repr(refused.value)
    async with connect(f"{keyed.base_url}/mcp", key=KEY) as mcp:
        assert {t.name for t in (await mcp.list_tools()).tools} == TOOLS


def usage_row(srv: ServerProcess, model: str) -> dict[str, Any] | None:
    rows = httpx.get(f"{srv.base_url}/v1/usage", headers={"x-api-key": KEY}, timeout=10).json()["data"]
    mine = [r for r in rows if r["model"] == model and r["key"] == LABEL]
    return mine[0] if mine else None


async def test_embed_returns_a_normalised_vector_per_text_billed_to_the_callers_key(keyed: ServerProcess) -> None:
    before = usage_row(keyed, ONNX_MODEL)
    async with connect(f"{keyed.base_url}/mcp", key=KEY) as mcp:
        result = await mcp.call_tool("embed", {"texts": ["food", "bread", "galaxy"], "model": ONNX_MODEL})
        listed = (await mcp.call_tool("list_models", {"capability": "embeddings"})).structured_content
    assert not result.is_error, text_of(result)
    facts = result.structured_content
    assert facts is not None and facts["model"] == ONNX_MODEL and facts["dimensions"] == 384
    assert listed is not None and ONNX_MODEL in {m["id"] for m in listed["models"]}
    assert listed["defaults"]["embed"] == min(m["id"] for m in listed["models"])  # none preferred: the first
    vectors = np.array(facts["embeddings"], dtype=np.float32)
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    food, bread, galaxy = vectors
    assert food @ bread > food @ galaxy
    assert json.loads(text_of(result)) == facts  # the structured result, as text too (MCP's SHOULD)
    row = usage_row(keyed, ONNX_MODEL)
    assert row is not None
    assert row["requests"] == (before["requests"] if before else 0) + 1
    assert row["prompt_tokens"] - (before["prompt_tokens"] if before else 0) == facts["usage"]["prompt_tokens"]


async def test_audio_past_max_body_mb_is_a_tool_error(keyed: ServerProcess) -> None:
    past = base64.b64encode(b"\0" * ((1 << 20) + 3000)).decode()  # the body fits, the audio is over 1 MiB
    async with connect(f"{keyed.base_url}/mcp", key=KEY) as mcp:
        result = await mcp.call_tool("transcribe", {"audio": past})
        assert result.is_error and f"at most {1 << 20} are accepted" in text_of(result), text_of(result)


def test_a_body_past_the_bound_is_refused_before_it_is_read(keyed: ServerProcess) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "transcribe", "arguments": {"audio": "A" * (2 << 20)}}}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}  # fmt: skip
    r = httpx.post(f"{keyed.base_url}/mcp", json=body, headers=headers, timeout=30)
    assert r.status_code == 413, r.text


async def test_a_call_past_its_keys_deadline_is_a_tool_error_and_its_worker_request_is_cancelled(
    keyed: ServerProcess,
) -> None:
    url = f"{keyed.base_url}/mcp"
    async with connect(url, key=KEY) as mcp:  # the model loaded, within no deadline
        assert not (await mcp.call_tool("chat", {"prompt": SEQUENCE, "max_tokens": 2})).is_error
    async with connect(url, key=HASTY) as mcp:
        result = await mcp.call_tool("chat", {"prompt": LONG, "max_tokens": 2000, "temperature": 0})
    assert result.is_error and "limit of 1 s" in text_of(result), text_of(result)
    async with httpx.AsyncClient(headers={"x-api-key": KEY}, timeout=10) as http:
        workers = (await http.get(f"{keyed.base_url}/v1/workers")).json()["data"]
    assert [w["inflight"] for w in workers if w["model"] == MODEL] == [0]
    assert counter(keyed, "geniex:requests_total", model=MODEL, outcome="cancelled") == 1


def test_a_call_in_flight_is_drained_on_sigterm_and_new_calls_are_refused(keyed: ServerProcess) -> None:
    """Last in this module: it stops the keyed server."""
    import asyncio

    outcome: dict[str, Any] = {}

    def call() -> None:
        async def run() -> None:
            async with connect(f"{keyed.base_url}/mcp", key=KEY) as mcp:
                await mcp.list_tools()  # the client checks a result against its tool's schema, listed once
                outcome["result"] = await mcp.call_tool("chat", {"prompt": LONG, "max_tokens": 150, "temperature": 0})

        asyncio.run(run())

    worker = threading.Thread(target=call)
    worker.start()
    auth = {"x-api-key": KEY}
    deadline = time.monotonic() + 120
    while not any(w["inflight"] for w in httpx.get(f"{keyed.base_url}/v1/workers", headers=auth, timeout=10)
                  .json()["data"] if w["model"] == MODEL):  # fmt: skip
        assert time.monotonic() < deadline and worker.is_alive(), "the chat call never reached its worker"
        time.sleep(0.05)
    keyed.proc.send_signal(signal.SIGTERM)
    while httpx.get(f"{keyed.base_url}/ready", timeout=5).status_code != 503:  # the signal is handled at once
        time.sleep(0.05)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    refused = httpx.post(f"{keyed.base_url}/mcp", json=ping, timeout=5, headers={
        **auth, "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"})  # fmt: skip
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
    worker.join(120)
    result = outcome["result"]
    assert not result.is_error, text_of(result)
    assert result.structured_content["finish_reason"] == "length", "the call in flight finished during the drain"
    assert keyed.proc.wait(30) == 0
