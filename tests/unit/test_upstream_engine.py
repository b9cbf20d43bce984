"""The upstream engine's pieces that need no server: the descriptor's checks, the store entry
`pull --upstream` writes, and the translation between our wire messages and the OpenAI protocol
(the integration tests in tests/integration/test_upstream.py run it against a real upstream)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from gateway.chat.tool_calls import parse_tool_calls
from gateway.errors import BadGateway, BadRequest, GatewayTimeout, error_for
from gateway.models.capabilities import capabilities_of
from gateway.models.store import ModelStore
from gateway.supervisor.compute import resolve_compute
from gateway.supervisor.memory import UPSTREAM_WORKER_BYTES, estimate_worker_bytes
from protocol.upstream import UpstreamError, UpstreamSpec, validate
from protocol.wire import Constraint, Delta, Done, Embed, ErrorKind, Generate, LogprobDelta, Sampling
from workers.engines.upstream_openai import (
    StreamReader,
    UpstreamFailure,
    embed_request,
    embeddings_of,
    error_text,
    generate_request,
    refusal,
    scores_of,
)

BASE = "http://gpu-box:8000/v1"


def spec(**kw: object) -> UpstreamSpec:
    return UpstreamSpec(**{"base_url": BASE, "model": "m", **kw})  # type: ignore[arg-type]


# ---------------------------------------------------------------- the descriptor


def test_validate_normalises_url_and_capabilities() -> None:
    s = validate(spec(base_url=BASE + "/", capabilities=["Chat", "completions", "embedding", "chat"]))
    assert s.base_url == BASE
    assert s.capabilities == ["chat", "completion", "embeddings"]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"base_url": "http://user:secret@gpu-box/v1"}, "plain text"),
        ({"base_url": "ftp://gpu-box/v1"}, "http(s)"),
        ({"base_url": "http://gpu-box/v1?key=abc"}, "no query"),
        ({"base_url": "http://gpu-box:99999/v1"}, "Port"),
        ({"api_key_env": "sk-live 1234"}, "NAME of an environment variable"),
        ({"api_key_env": "KEY", "api_key_file": "/k"}, "not both"),
        ({"api_key_file": "relative/key"}, "absolute"),
        ({"capabilities": ["speech"]}, "capability"),
        ({"capabilities": ["tools"]}, "needs 'chat'"),
        ({"read_timeout": 0.0}, "read_timeout"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"rerank_path": "../admin"}, "rerank_path"),
        ({"model": "a\nb"}, "one line"),
    ],
)
def test_validate_refuses(fields: dict[str, object], says: str) -> None:
    with pytest.raises(UpstreamError, match=None) as info:
        validate(spec(**fields))
    assert says in str(info.value)
    assert "secret" not in str(info.value)


def test_store_entry_names_the_credential_never_holds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", "sk-very-secret")
    store = ModelStore(tmp_path, bundled=[])
    entry = store.add_upstream("acme/big-model:fp8", spec(api_key_env="UPSTREAM_KEY", capabilities=["chat"]))
    assert (entry.id, entry.engine) == ("acme/big-model:fp8", "upstream")
    assert store.resolve("acme/big-model").path == entry.path
    written = b"".join(p.read_bytes() for p in (tmp_path / "models" / "acme" / "big-model").iterdir())
    assert b"UPSTREAM_KEY" in written and b"sk-very-secret" not in written
    assert capabilities_of("upstream", entry.path) == ["chat"]
    # Small and fixed: an upstream worker never evicts a local model for its room.
    assert estimate_worker_bytes(entry.path, 4096 * 4) == UPSTREAM_WORKER_BYTES
    assert resolve_compute("gpu", "upstream") == "remote"
    with pytest.raises(BadRequest, match="plain text"):
        store.add_upstream("acme/other", spec(base_url="https://u:p@host/v1"))
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(BadRequest, match="already holds upstream"):
        store.add_variant("acme", "big-model", "Q4_0", gguf, "local:x")


def test_a_hand_broken_descriptor_serves_nothing(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, bundled=[])
    entry = store.add_upstream("acme/m", spec())
    Path(entry.path).write_text('{"base_url": "file:///etc/passwd", "model": "m"}')
    assert capabilities_of("upstream", entry.path) == []
    Path(entry.path).write_text("[" * 100_000)
    assert capabilities_of("upstream", entry.path) == []
    assert capabilities_of("upstream", str(tmp_path / "missing.upstream.json")) == []


def test_error_kinds_map_to_gateway_statuses() -> None:
    assert isinstance(error_for(ErrorKind.UPSTREAM, "x"), BadGateway) and BadGateway.status == 502
    assert isinstance(error_for(ErrorKind.UPSTREAM_TIMEOUT, "x"), GatewayTimeout) and GatewayTimeout.status == 504


# ---------------------------------------------------------------- requests


def chat(**kw: object) -> Generate:
    return Generate(0, "log", messages=[{"role": "user", "content": "hi"}], **kw)  # type: ignore[arg-type]


def test_chat_request_carries_the_plan() -> None:
    path, body = generate_request(chat(max_tokens=5, stop=["\n"], sampling=Sampling(temperature=0.0, seed=7),
                                       logit_bias=[(2, -100.0)], logprobs=3), "up-model")  # fmt: skip
    assert path == "chat/completions"
    assert body["model"] == "up-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["stop"], body["seed"], body["temperature"]) == (5, ["\n"], 7, 0.0)
    assert body["logit_bias"] == {"2": -100.0}
    assert (body["logprobs"], body["top_logprobs"]) == (True, 3)
    # Our sampler's defaults are not imposed on the upstream: it keeps its own.
    assert not {"top_k", "min_p", "repetition_penalty"} & set(body)
    _, body = generate_request(chat(sampling=Sampling(top_k=5)), "m")
    assert body["top_k"] == 5


def test_tools_and_forced_call() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    forced = json.dumps({"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {}}})
    history = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
            ],
        }
    ]
    g = Generate(0, "", messages=history, tools=tools, constraint=Constraint("json_schema", forced, "tools"))
    _, body = generate_request(g, "m")
    assert body["tools"] == tools
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    # Templates wanted the arguments as an object; OpenAI wants their JSON text back.
    assert json.loads(body["messages"][0]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}


def test_constraints() -> None:
    _, body = generate_request(chat(constraint=Constraint("json_schema", '{"type": "object"}', "enable_json")), "m")
    assert body["response_format"] == {"type": "json_object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    _, body = generate_request(chat(constraint=Constraint("json_schema", json.dumps(schema), "response_format")), "m")
    assert body["response_format"]["json_schema"]["schema"] == schema
    with pytest.raises(UpstreamFailure) as info:
        generate_request(chat(constraint=Constraint("gbnf", 'root ::= "a"', "grammar_string")), "m")
    assert info.value.kind is ErrorKind.BAD_REQUEST and "`grammar_string`" in info.value.message


def test_text_completion_and_embeddings_requests() -> None:
    path, body = generate_request(Generate(0, "", prompt="def f(", suffix="return 1"), "m")
    assert (path, body["prompt"], body["suffix"]) == ("completions", "def f(", "return 1")
    assert embed_request(Embed(0, "", texts=["a"], dimensions=8), "e") == {
        "model": "e", "input": ["a"], "encoding_format": "base64", "dimensions": 8}  # fmt: skip


# ---------------------------------------------------------------- replies


def chunk(**delta: object) -> bytes:
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}).encode()


def test_stream_reader_text_reasoning_and_usage() -> None:
    r = StreamReader(9, "upstream X")
    out = [*r.feed(chunk(reasoning_content="hmm")), *r.feed(chunk(content="Hello")), *r.feed(chunk(content="!"))]
    assert [(type(m), m.text, m.n_tokens) for m in out] == [
        (Delta, "<think>hmm", 1), (Delta, "</think>Hello", 2), (Delta, "!", 3)]  # fmt: skip
    r.feed(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}).encode())
    r.feed(json.dumps({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 4,
                                                "prompt_tokens_details": {"cached_tokens": 3}}}).encode())  # fmt: skip
    r.feed(b"[DONE]")
    assert r.complete()
    (done,) = r.close()
    assert done == Done(9, "length", prompt_tokens=11, completion_tokens=4, cached_tokens=3)


def test_stream_reader_renders_tool_calls_for_the_gateways_parser() -> None:
    r = StreamReader(1, "upstream X")
    r.feed(chunk(tool_calls=[{"index": 0, "id": "a", "function": {"name": "get_weather", "arguments": '{"ci'}}]))
    r.feed(chunk(tool_calls=[{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]))
    r.feed(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}).encode())
    delta, done = r.close()
    assert isinstance(delta, Delta) and done.finish_reason == "stop"
    text, calls = parse_tool_calls(delta.text, {"get_weather"})
    assert text == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]


def test_stream_reader_logprobs_and_errors() -> None:
    r = StreamReader(1, "upstream X")
    lp = {"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                       "top_logprobs": [{"token": "Hi", "logprob": -0.5}]}]}  # fmt: skip
    (m,) = r.feed(json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": lp}]}).encode())
    assert isinstance(m, LogprobDelta) and m.logprobs[0].token == b"Hi" and m.logprobs[0].top == [(b"Hi", -0.5)]
    assert not r.complete()  # no finish_reason, no [DONE]: a stream that stops here broke off
    with pytest.raises(UpstreamFailure) as info:
        r.feed(b'{"error": {"message": "worker died", "code": 500}}')
    assert info.value.kind is ErrorKind.UPSTREAM and "worker died" in info.value.message


def test_error_bodies_and_statuses() -> None:
    assert error_text(b'{"error": "plain"}') == "plain"
    assert error_text(b'{"error": {"message": "openai"}}') == "openai"
    assert error_text(b'{"object": "error", "message": "vllm"}') == "vllm"
    assert error_text(b"<html>oops</html>") == "<html>oops</html>"
    assert refusal(400, b'{"error": "bad bias"}', "U").kind is ErrorKind.BAD_REQUEST
    assert "bad bias" in refusal(422, b'{"detail": "bad bias"}', "U").message
    assert refusal(429, b"{}", "U").kind is ErrorKind.OVERLOADED
    denied = refusal(401, b'{"error": "key sk-abc is wrong"}', "U")
    # Our client must not read a 401 as its own key being wrong, nor see what the upstream said of ours.
    assert denied.kind is ErrorKind.UPSTREAM and "sk-abc" not in denied.message
    assert refusal(503, b"busy", "U").kind is ErrorKind.UPSTREAM


def test_embeddings_and_scores_answers() -> None:
    import base64

    import numpy as np

    rows = [np.array([1, 0], "<f4"), np.array([0, 1], "<f4")]
    body = {"data": [{"index": 1, "embedding": base64.b64encode(rows[1].tobytes()).decode()},
                     {"index": 0, "embedding": [1.0, 0.0]}], "usage": {"prompt_tokens": 4}}  # fmt: skip
    dim, data, tokens = embeddings_of(body, 2, "U")
    assert (dim, tokens) == (2, 4) and np.frombuffer(data, "<f4").tolist() == [1, 0, 0, 1]
    with pytest.raises(UpstreamFailure):
        embeddings_of(body, 3, "U")
    assert scores_of({"results": [{"index": 1, "relevance_score": 0.2}, {"index": 0, "relevance_score": 0.9}]},
                     2, "U") == ([0.9, 0.2], 0)  # fmt: skip
    assert scores_of({"result": [0.1, 0.3]}, 2, "U") == ([0.1, 0.3], 0)
    assert msgspec.json.decode(msgspec.json.encode(spec())) == msgspec.to_builtins(spec())


# ---------------------------------------------------------------- the pool, with real worker processes


async def test_an_upstream_worker_never_evicts_a_local_model(tmp_path: Path) -> None:
    """With room for one model (--max-loaded 1), a local (fake) worker stays resident when an
    upstream model's worker starts beside it; the upstream one gets compute "remote", no share of
    the cores, and its probe's verdict (here: nothing listens there) reaches the handle."""
    import zmq.asyncio

    from gateway.ops.metrics import Metrics
    from gateway.ops.settings import Settings
    from gateway.supervisor.pool import WorkerPool
    from tests.server_proc import free_port
    from tests.unit.test_supervisor import fake_model, until, worker

    store = ModelStore(tmp_path, bundled=[])
    remote = store.add_upstream("acme/remote", spec(base_url=f"http://127.0.0.1:{free_port()}/v1", probe_interval=60))
    pool = WorkerPool(Settings(data_dir=tmp_path, parallel=2, max_queue=2, keep_alive_s=-1.0, max_loaded=1),
                      zmq.asyncio.Context(), Metrics(process=False))  # fmt: skip
    pool.start()
    try:
        local = await worker(pool, fake_model(tmp_path, "local"))
        up = await worker(pool, remote)
        assert local.alive and up.alive and len(pool.workers) == 2
        assert (up.key.compute, up.engine, up.ready_info and up.ready_info.tool_format) == ("remote", "upstream",
                                                                                          "hermes")  # fmt: skip
        await until(lambda: up.upstream_health is not None)
        assert up.upstream_health is not None and not up.upstream_health.healthy
        assert up.upstream_health.detail.startswith("unreachable")
    finally:
        await pool.close()
        pool.zctx.destroy(linger=0)


async def test_event_lines_are_split_across_reads_and_bounded() -> None:
    import httpx

    from workers.engines.upstream import _lines

    async def parts(chunks: list[bytes]):  # type: ignore[no-untyped-def]
        for c in chunks:
            yield c

    async def read(chunks: list[bytes], limit: int) -> list[bytes]:
        r = httpx.Response(200, content=parts(chunks))
        return [line async for line in _lines(r, limit, "upstream X")]

    assert await read([b"data: a\r\n\r\nda", b"ta: b\n", b"data: c"], 64) == [b"data: a", b"", b"data: b", b"data: c"]
    # A hostile or broken upstream that never ends its line: refused, not buffered without bound.
    with pytest.raises(UpstreamFailure, match="upstream X sent an event longer"):
        await read([b"x" * 40, b"y" * 40], 64)


def test_queued_deltas_of_one_request_go_as_one() -> None:
    from protocol.wire import Started, TokenLogprob
    from workers.engines.thread_replies import coalesce

    lp = LogprobDelta(1, "c", 3, [TokenLogprob(b"c", -0.1)])
    msgs = [Started(1, 0), Delta(1, "a", 1), Delta(1, "b", 2), Delta(2, "x", 1), Delta(1, "c", 3), lp,
            Done(1, "stop", completion_tokens=4)]  # fmt: skip
    assert coalesce(msgs) == [Started(1, 0), Delta(1, "ab", 2), Delta(2, "x", 1), Delta(1, "c", 3), lp,
                              Done(1, "stop", completion_tokens=4)]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--upstream", "http://alice:pw@gpu-box/v1"], "plain text"),
        (["--upstream", "http://gpu-box/v1", "--upstream-key-env", "sk-live-0123"], "NAME of an environment variable"),
        (["--upstream", "http://gpu-box/v1", "--upstream-capabilities", "chat,images"], "capability 'images'"),
        (["--upstream", "http://gpu-box/v1", "--upstream-timeout", "-1"], "read_timeout"),
        (["--upstream", "http://gpu-box/v1", "--upstream-concurrency", "100000"], "max_concurrency"),
        (["--upstream", "http://gpu-box/v1", "--local", "/etc/passwd"], "one or the other"),
        (["--upstream-config", "/nonexistent/upstream.json"], "--upstream-config"),
    ],
)
def test_pull_upstream_refuses_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   flags: list[str], says: str) -> None:  # fmt: skip
    from gateway.cli import main

    assert main(["pull", "acme/m", *flags, "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert says in err and "pw" not in err
    assert ModelStore(tmp_path, bundled=[]).entries() == []


def test_pull_upstream_from_flags_and_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    config = tmp_path / "up.json"
    config.write_text(json.dumps({"base_url": "http://gpu-box:8000/v1", "model": "qwen3", "probe_interval": 5}))
    assert main(["pull", "acme/qwen:fp8", "--upstream-config", str(config), "--upstream-key-env", "VLLM_API_KEY",
                 "--upstream-capabilities", "chat,completions,embeddings", "--data-dir", str(tmp_path)]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == "acme/qwen:fp8"
    (entry,) = ModelStore(tmp_path, bundled=[]).entries()
    written = msgspec.json.decode(Path(entry.path).read_bytes())
    assert written["base_url"] == "http://gpu-box:8000/v1" and written["model"] == "qwen3"
    assert (written["probe_interval"], written["api_key_env"]) == (5.0, "VLLM_API_KEY")
    assert written["capabilities"] == ["chat", "completion", "embeddings"]
