"""Models served elsewhere: a real `geniex serve` (the bundled SmolLM2 and the ONNX MiniLM, with an
API key of its own) is the upstream, registered in our server's store with the real
`geniex pull --upstream`, and spoken to through our server with the real OpenAI SDK and httpx.

The failure cases: the upstream not started (a port nobody listens on), killed mid-answer (a
second real upstream, SIGKILLed), refusing a request (a 400 of its own), and slow past the
timeout. Only slowness needs a stand-in: a small HTTP server in this process that stays silent
(before answering, or after one word); it also records the headers it receives, to show which key
reaches an upstream, and holds requests to fill our queue.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import MODEL as SMOLLM
from tests.conftest import WEATHER_PARAMETERS
from tests.embedding_models import ONNX_MODEL, data_dir_with_models, geniex
from tests.integration.test_lifecycle import wait_for
from tests.server_proc import ServerProcess, free_port, serving

UP_KEY = "sk-upstream-credential-7f3a9c51"  # the upstream's key: only our server holds it
OUR_KEY = "sk-geniex-client-key-0b1d2e44"  # our client's key: it must never reach an upstream
RECORDER_KEY = "sk-recorder-credential-99e1"
KEY_ENV = "UPSTREAM_TEST_KEY"
CHAT, EMBED = "remote/smollm", "remote/minilm"
DOWN, SLOW, RECORDER, WRONG_KEY = "remote/down", "remote/slow", "remote/recorder", "remote/wrong-key"
STALL = "remote/stall"  # starts an answer, then goes silent
NARROW = "remote/narrow"  # one request at a time to an upstream that hangs: the queue fills
# SmolLM2's <|endoftext|> and <|im_end|> banned: the answer runs until max_tokens or a cancel.
NO_EOS = {"0": -100, "2": -100}
LONG = 1500


class StandIn(BaseHTTPRequestHandler):
    """/slow/v1/... and /hang/v1/...: answer nothing until the test lets them. /rec/v1/...: a one-word
    answer. All record the headers they were sent."""

    protocol_version = "HTTP/1.0"
    seen: ClassVar[list[dict[str, str]]] = []
    release = threading.Event()
    unhang = threading.Event()

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # the health probe
        self.seen.append(dict(self.headers))
        self._send(200, b'{"object": "list", "data": []}', "application/json")

    def do_POST(self) -> None:
        self.seen.append(dict(self.headers))
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path.startswith("/slow/"):
            self.release.wait(60)
            return
        if self.path.startswith("/hang/"):
            self.unhang.wait(60)
            return
        if self.path.startswith("/stall/"):  # one word, then silence
            first = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b"data: " + json.dumps(first).encode() + b"\n\n")
            self.wfile.flush()
            self.release.wait(60)
            return
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                  {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}]  # fmt: skip
        body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        self._send(200, body, "text/event-stream")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def stand_in() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        StandIn.release.set()
        StandIn.unhang.set()
        srv.shutdown()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = data_dir_with_models(tmp_path_factory.getbasetemp() / "embedding-models")
    with serving(data, "--api-key", UP_KEY, "--nctx", "2048", "--keep-alive-s", "600") as srv:
        yield srv


def pull(data: Path, name: str, url: str, *flags: str) -> None:
    assert geniex("pull", name, "--upstream", url, *flags, "--data-dir", str(data)) == f"{name}:default"


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory, upstream: ServerProcess, stand_in: str) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("ours")
    up = f"{upstream.base_url}/v1"
    pull(data, CHAT, up, "--upstream-model", SMOLLM, "--upstream-key-env", KEY_ENV)
    # The same settings from a config file (GenieX as the upstream answers rerank at /v1/reranking).
    config = data / "minilm.json"
    config.write_text(json.dumps({"model": ONNX_MODEL, "capabilities": ["embeddings", "rerank"],
                                  "rerank_path": "reranking", "api_key_env": KEY_ENV}))  # fmt: skip
    pull(data, EMBED, up, "--upstream-config", str(config))
    pull(data, DOWN, f"http://127.0.0.1:{free_port()}/v1", "--upstream-connect-timeout", "2")
    pull(data, SLOW, f"{stand_in}/slow/v1", "--upstream-timeout", "1")
    pull(data, STALL, f"{stand_in}/stall/v1", "--upstream-timeout", "1")
    pull(data, NARROW, f"{stand_in}/hang/v1", "--upstream-concurrency", "1", "--upstream-timeout", "60")
    (data / "recorder.key").write_text(RECORDER_KEY + "\n")
    pull(data, RECORDER, f"{stand_in}/rec/v1", "--upstream-key-file", str(data / "recorder.key"))
    (data / "wrong.key").write_text("sk-not-the-upstreams-key\n")
    pull(data, WRONG_KEY, up, "--upstream-model", SMOLLM, "--upstream-key-file", str(data / "wrong.key"))
    with serving(data, "--api-key", OUR_KEY, "--nctx", "2048", "--max-queue", "2", env={KEY_ENV: UP_KEY}) as srv:
        yield srv


def sdk(srv: ServerProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=key, max_retries=0, timeout=120)


def get(srv: ServerProcess, path: str, key: str) -> httpx.Response:
    return httpx.get(f"{srv.base_url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def post(srv: ServerProcess, path: str, key: str = OUR_KEY, **body: object) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", headers={"Authorization": f"Bearer {key}"}, json=body, timeout=120)


def worker_row(srv: ServerProcess, key: str, model: str) -> dict:  # type: ignore[type-arg]
    rows = [w for w in get(srv, "/v1/workers", key).json()["data"] if w["model"] == model]
    assert len(rows) == 1, rows
    return rows[0]


HI = [{"role": "user", "content": "Name three colours."}]


def test_chat_completions_and_usage_match_the_upstream(ours: ServerProcess, upstream: ServerProcess) -> None:
    direct = sdk(upstream, UP_KEY).chat.completions.create(model=SMOLLM, messages=HI, max_tokens=12, temperature=0)
    client = sdk(ours, OUR_KEY)
    via = client.chat.completions.create(model=CHAT, messages=HI, max_tokens=12, temperature=0, user="usage-check")
    assert via.model == f"{CHAT}:default"
    assert via.choices[0].message.content == direct.choices[0].message.content
    assert via.choices[0].finish_reason == direct.choices[0].finish_reason == "length"
    assert (via.usage.prompt_tokens, via.usage.completion_tokens) == (direct.usage.prompt_tokens, 12)
    chunks = list(client.chat.completions.create(model=CHAT, messages=HI, max_tokens=12, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}, user="usage-check"))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12
    # Our ledger holds the upstream's counts, for our client's key and user.
    rows = [r for r in get(ours, "/v1/usage", OUR_KEY).json()["data"] if r["model"] == f"{CHAT}:default"
            and r["user"] == "usage-check"]  # fmt: skip
    assert sum(r["requests"] for r in rows) == 2
    assert sum(r["prompt_tokens"] for r in rows) == 2 * direct.usage.prompt_tokens
    assert sum(r["completion_tokens"] for r in rows) == 24


def test_completions_and_dialects(ours: ServerProcess, upstream: ServerProcess) -> None:
    direct = sdk(upstream, UP_KEY).completions.create(model=SMOLLM, prompt="The sky is", max_tokens=6, temperature=0)
    via = sdk(ours, OUR_KEY).completions.create(model=CHAT, prompt="The sky is", max_tokens=6, temperature=0)
    assert via.choices[0].text == direct.choices[0].text and via.usage.completion_tokens == 6
    # Anthropic Messages and OpenAI Responses build the same plan: they reach the upstream too.
    r = post(ours, "/v1/messages", model=CHAT, max_tokens=6, messages=HI, temperature=0)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 6 and r.json()["content"][0]["text"]
    r = post(ours, "/v1/responses", model=CHAT, input="Name three colours.", max_output_tokens=6, temperature=0)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 6


def test_embeddings_and_rerank(ours: ServerProcess, upstream: ServerProcess) -> None:
    words = ["food", "bread", "galaxy"]
    direct = sdk(upstream, UP_KEY).embeddings.create(model=ONNX_MODEL, input=words)
    via = sdk(ours, OUR_KEY).embeddings.create(model=EMBED, input=words)
    a = np.array([d.embedding for d in via.data])
    assert a.shape == (3, 384)
    np.testing.assert_allclose(a, np.array([d.embedding for d in direct.data]), atol=1e-6)
    assert via.usage.prompt_tokens == direct.usage.prompt_tokens > 0
    body = {"query": "something to eat", "documents": ["bread", "galaxy", "food"]}
    direct_scores = post(upstream, "/v1/reranking", UP_KEY, model=ONNX_MODEL, **body).json()["result"]
    r = post(ours, "/v1/reranking", model=EMBED, **body)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["result"], direct_scores, atol=1e-6)
    # Capabilities come from the manifest: the embedding upstream does not chat.
    r = post(ours, "/v1/chat/completions", model=EMBED, messages=HI, max_tokens=2)
    assert r.status_code == 400 and "does not support chat" in r.json()["error"]


def test_tool_call(ours: ServerProcess) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}}]
    r = sdk(ours, OUR_KEY).chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools, max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0)  # fmt: skip
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")


def test_cancel_reaches_the_upstream(ours: ServerProcess, upstream: ServerProcess) -> None:
    rows = [w for w in get(upstream, "/v1/workers", UP_KEY).json()["data"] if w["model"] == SMOLLM]
    before = rows[0]["tokens_generated"] if rows else 0
    body = {"model": CHAT, "messages": HI, "max_tokens": LONG, "logit_bias": NO_EOS, "stream": True}
    with httpx.stream("POST", f"{ours.base_url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {OUR_KEY}"}) as r:  # fmt: skip
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # the answer is under way: leave
    # The upstream stops decoding when we close its stream: nothing in flight, far fewer tokens than asked.
    row = wait_for(
        lambda: (w := worker_row(upstream, UP_KEY, SMOLLM))["inflight"] == 0 and w, timeout=60, what="upstream idle"
    )
    assert 0 < row["tokens_generated"] - before < LONG
    assert wait_for(
        lambda: worker_row(ours, OUR_KEY, f"{CHAT}:default")["inflight"] == 0, timeout=60, what="our worker idle"
    )


def test_workers_and_metrics_show_the_upstream(ours: ServerProcess, upstream: ServerProcess) -> None:
    row = wait_for(
        lambda: (w := worker_row(ours, OUR_KEY, f"{CHAT}:default"))["upstream"] and w, timeout=60, what="a probe"
    )
    assert (row["engine"], row["compute"]) == ("upstream", "remote")
    assert row["upstream"]["healthy"] is True and row["upstream"]["url"] == f"{upstream.base_url}/v1"
    metrics = get(ours, "/metrics", OUR_KEY).text
    for family in ("geniex:worker_info", "geniex:upstream_up"):
        assert any(line.startswith(family + "{") and 'engine="upstream"' in line and f'model="{CHAT}:default"' in line
                   and line.endswith(" 1.0") for line in metrics.splitlines()), family  # fmt: skip


def test_upstream_not_started_is_502(ours: ServerProcess) -> None:
    r = post(ours, "/v1/chat/completions", model=DOWN, messages=HI, max_tokens=2)
    assert r.status_code == 502, r.text
    assert "127.0.0.1:" in r.json()["error"] and "unreachable" in r.json()["error"]
    # The worker's probe sees it too; other models, local ones included, still serve.
    row = wait_for(
        lambda: (w := worker_row(ours, OUR_KEY, f"{DOWN}:default"))["upstream"] and w, timeout=60, what="a probe"
    )
    assert row["upstream"]["healthy"] is False and row["upstream"]["detail"].startswith("unreachable")
    assert get(ours, "/ready", OUR_KEY).status_code == 200
    local = post(ours, "/v1/chat/completions", model=SMOLLM, messages=HI, max_tokens=2)
    assert local.status_code == 200, local.text


def test_slow_upstream_is_504(ours: ServerProcess) -> None:
    r = post(ours, "/v1/chat/completions", model=SLOW, messages=HI, max_tokens=2)
    assert r.status_code == 504, r.text
    assert "did not answer within 1s" in r.json()["error"]


def test_silence_mid_answer_ends_the_stream_with_an_error(ours: ServerProcess) -> None:
    events = []
    with httpx.stream("POST", f"{ours.base_url}/v1/chat/completions", timeout=60, headers={"Authorization": f"Bearer {OUR_KEY}"},
                      json={"model": STALL, "messages": HI, "max_tokens": 5, "stream": True}) as r:  # fmt: skip
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert '"content":"ok"' in "".join(events)
    assert events[-1] == "[DONE]" and "did not answer within 1s" in json.loads(events[-2])["error"]


def test_full_queue_is_503(ours: ServerProcess) -> None:
    """Our queue in front of an upstream works as for a local model: `max_concurrency` (1) sent,
    `--max-queue` (2) waiting, then 503 with Retry-After."""
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(
        post(ours, "/v1/chat/completions", model=NARROW, messages=HI, max_tokens=2).status_code)) for _ in range(3)]  # fmt: skip
    try:
        for t in threads:
            t.start()
        wait_for(lambda: (w := [x for x in get(ours, "/v1/workers", OUR_KEY).json()["data"]
                             if x["model"] == f"{NARROW}:default"]) and w[0]["inflight"] == 3, timeout=60, what="three in flight")  # fmt: skip
        r = post(ours, "/v1/chat/completions", model=NARROW, messages=HI, max_tokens=2)
        assert r.status_code == 503 and "at capacity" in r.json()["error"] and r.headers["retry-after"]
    finally:
        StandIn.unhang.set()  # the stand-in closes without answering: the three end as 502s
        for t in threads:
            t.join(60)
    assert results == [502, 502, 502]


def test_upstream_400_is_passed_through(ours: ServerProcess) -> None:
    r = post(ours, "/v1/chat/completions", model=CHAT, messages=HI, max_tokens=2, logit_bias={"99999999": 1})
    assert r.status_code == 400, r.text
    assert "not in the vocabulary" in r.json()["error"]
    r = post(ours, "/v1/chat/completions", model=CHAT, messages=HI, max_tokens=2, grammar_string='root ::= "a"')
    assert r.status_code == 400 and "not forwarded to an upstream" in r.json()["error"]


def test_keys_never_cross(ours: ServerProcess, upstream: ServerProcess) -> None:
    StandIn.seen.clear()
    r = post(ours, "/v1/chat/completions", model=RECORDER, messages=HI, max_tokens=2)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    sent = [h for h in StandIn.seen if "authorization" in {k.lower() for k in h}]
    assert sent, StandIn.seen
    for headers in StandIn.seen:
        assert OUR_KEY not in json.dumps(headers)  # our client's key stays with us
        lower = {k.lower(): v for k, v in headers.items()}
        assert lower.get("authorization") == f"Bearer {RECORDER_KEY}" and "x-api-key" not in lower
    # The upstream's credential is not a key of ours...
    assert post(ours, "/v1/chat/completions", key=UP_KEY, model=CHAT, messages=HI, max_tokens=2).status_code == 401
    # ...and an upstream refusing our credential is our 502, not a 401 our client would misread.
    r = post(ours, "/v1/chat/completions", model=WRONG_KEY, messages=HI, max_tokens=2)
    assert r.status_code == 502 and "credential" in r.json()["error"]
    assert "sk-not-the-upstreams-key" not in r.text
    table = get(ours, "/v1/workers", OUR_KEY).text + get(ours, "/v1/models", OUR_KEY).text
    assert UP_KEY not in table and RECORDER_KEY not in table


def test_upstream_killed_mid_stream(ours: ServerProcess, tmp_path: Path) -> None:
    victim = ServerProcess(tmp_path / "victim", "--nctx", "2048")
    try:
        victim.wait_ready()
        pull(ours.data_dir, "remote/victim", f"{victim.base_url}/v1", "--upstream-model", SMOLLM)
        body = {"model": "remote/victim", "messages": HI, "max_tokens": LONG, "logit_bias": NO_EOS, "stream": True}
        events: list[str] = []
        with httpx.stream("POST", f"{ours.base_url}/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {OUR_KEY}"}) as r:  # fmt: skip
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if victim.proc.poll() is None and '"content":"' in line and '"content":""' not in line:
                        victim.proc.kill()  # mid-answer: the upstream is gone
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert victim.base_url in error and "broke off" in error
        assert get(ours, "/ready", OUR_KEY).status_code == 200
    finally:
        victim.stop()
