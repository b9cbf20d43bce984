"""Bounded work per request: what one request may make the server do is capped, and past each cap
the answer is a 4xx that names it, before any model is loaded or any worker spends time on it."""

from __future__ import annotations

import httpx
import pytest

from protocol.limits import MAX_KEEP_ALIVE_S, MAX_LOGIT_BIAS, MAX_MESSAGES, MAX_STOP, MAX_TOOLS
from protocol.logits import MAX_LOGIT_VALUES
from tests.conftest import MODEL
from tests.server_proc import ServerProcess

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def chat(server: ServerProcess, **body: object) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, **body},
                      timeout=60)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": HI * (MAX_MESSAGES + 1)}, "messages"),
        ({"messages": HI, "tools": [TOOL] * (MAX_TOOLS + 1)}, "tools"),
        ({"messages": HI, "stop": ["x"] * (MAX_STOP + 1)}, "stop"),
        ({"messages": HI, "stop": "x" * 5000}, "stop"),
        ({"messages": HI, "logit_bias": {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}}, "logit_bias"),
        ({"messages": HI, "keep_alive": MAX_KEEP_ALIVE_S + 1}, "keep_alive"),
        ({"messages": HI, "keep_alive": -2}, "keep_alive"),
        ({"messages": HI, "n": 17}, "n"),
    ],
)
def test_counts_past_their_bound_are_400s_naming_the_field(server: ServerProcess, body: dict, field: str) -> None:  # type: ignore[type-arg]
    r = chat(server, **body)
    assert r.status_code == 400 and f"`{field}`" in r.json()["error"], r.text[:300]


def test_keep_alive_of_infinity_is_a_400_and_minus_one_pins(server: ServerProcess) -> None:
    content = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "keep_alive": 1e400}'
    r = httpx.post(f"{server.base_url}/v1/chat/completions", content=content % MODEL.encode(),
                   headers={"content-type": "application/json"}, timeout=60)  # fmt: skip
    assert r.status_code == 400 and "`keep_alive`" in r.json()["error"], r.text
    assert chat(server, messages=HI, keep_alive=-1).status_code == 200


def test_nctx_beyond_the_trained_context_is_a_400(server: ServerProcess) -> None:
    """SmolLM2-135M was trained for 8192 tokens: more is refused before a worker is started."""

    def workers() -> list[tuple[int, int]]:
        return [(w["pid"], w["nctx"]) for w in httpx.get(f"{server.base_url}/v1/workers", timeout=10).json()["data"]]

    before = workers()
    r = chat(server, messages=HI, nctx=100_000)
    assert r.status_code == 400 and "trained for (8192)" in r.json()["error"], r.text
    assert workers() == before


def test_the_operator_may_allow_a_larger_nctx_or_cap_it_lower(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "512", "--max-nctx", "1024")
    r = chat(srv, messages=HI, nctx=2048)
    assert r.status_code == 400 and "--max-nctx (1024)" in r.json()["error"], r.text
    assert chat(srv, messages=HI, nctx=1024).status_code == 200


def test_a_prompt_that_cannot_fit_is_refused_without_tokenizing_it(server: ServerProcess) -> None:
    """The shared server's context is 2048 tokens; 200,000 characters cannot fit in it."""
    r = chat(server, messages=[{"role": "user", "content": "word " * 40_000}])
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded", r.text[:300]
    assert "200000 characters" in r.json()["error"]
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": "x" * 70_000, "max_tokens": 1})  # fmt: skip
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded", r.text[:300]


def test_a_body_over_max_body_is_a_413_in_the_error_shape(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--max-body-mb", "1")
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (1 << 20)}], "max_tokens": 1}
    r = httpx.post(f"{srv.base_url}/v1/chat/completions", json=big, timeout=60)
    assert r.status_code == 413 and isinstance(r.json()["error"], str), r.text[:300]
    small = {"model": MODEL, "messages": HI, "max_tokens": 1}
    assert httpx.post(f"{srv.base_url}/v1/chat/completions", json=small, timeout=60).status_code == 200


def test_logits_answers_are_capped(server: ServerProcess) -> None:
    url = f"{server.base_url}/v1/logits"
    # top_n given: the gateway knows the size of the answer before the model runs.
    r = httpx.post(url, json={"model": MODEL, "input_ids": [1] * 32, "top_n": MAX_LOGIT_VALUES // 31}, timeout=60)
    assert r.status_code == 400 and "logits" in r.json()["error"] and "`last_only`" in r.json()["error"], r.text
    # The whole vocabulary (49152) per row: the worker knows the width; 43 rows are over the cap.
    rows = MAX_LOGIT_VALUES // 49152 + 1
    r = httpx.post(url, json={"model": MODEL, "input_ids": [1] * rows, "top_n": 0}, timeout=60)
    assert r.status_code == 400 and f"{rows} x 49152" in r.json()["error"], r.text
    # Just under the cap: about 20 MB of JSON, converted row by row off the event loop.
    r = httpx.post(url, json={"model": MODEL, "input_ids": [1] * (rows - 1), "top_n": 0}, timeout=120)
    body = r.json()
    assert r.status_code == 200 and body["n_rows"] == rows - 1 == len(body["rows"])
    assert all(len(row["logits"]) == 49152 and "token_ids" not in row for row in body["rows"])
    assert body["object"] == "logits" and body["vocab_size"] == 49152


@pytest.mark.parametrize(
    "content",
    [
        {"messages": [{"role": "user", "content": "a\x00b"}]},
        {"messages": [{"role": "user\x00", "content": "hi"}]},
        {"messages": HI, "stop": ["\x00"]},
        {"messages": HI, "grammar_string": 'root ::= "a\x00"'},
        {"messages": HI, "user": "\x00"},
        {"messages": HI, "cache_salt": "\x00"},
        {"messages": HI, "tools": [{"type": "function", "function": {"name": "f\x00", "parameters": {}}}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "\x00"}]}]},
    ],
)
def test_nul_bytes_in_any_string_are_answered_or_refused_never_a_500(server: ServerProcess, content: dict) -> None:  # type: ignore[type-arg]
    r = chat(server, **content)
    assert r.status_code in (200, 400), r.text[:300]
    if r.status_code == 400:
        assert isinstance(r.json()["error"], str)


def test_headers_that_are_not_utf8_are_not_a_500(server: ServerProcess) -> None:
    for name, value in ((b"x-api-key", b"\xff\xfe"), (b"authorization", b"Bearer \xc3\x28"),
                        (b"x-request-id", b"\xff" * 10), (b"genieX-keepcache", b"\x80")):  # fmt: skip
        r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": HI, "max_tokens": 1}, headers=[(name, value)])  # fmt: skip
        assert r.status_code in (200, 400), (name, r.status_code, r.text[:300])
