"""Context overflow as the client's choice (`truncation`): a conversation longer than the context is
a 400 by default, and with `truncation: "auto"` loses its oldest turns until it fits, saying what
it dropped. The real server, the real SmolLM2, a 256-token context so that overflowing is cheap."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess, serving

NCTX = 256


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # debug: the worker logs the roles a truncated conversation kept
    with serving(tmp_path_factory.mktemp("data"), "--nctx", str(NCTX), "--log-level", "debug") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def turns(n: int, words: int = 6) -> list[dict[str, Any]]:
    """n user / assistant turns of about 80 tokens each."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append({"role": "user", "content": f"Question {i}: " + "tell me about the sea " * words})
        out.append({"role": "assistant", "content": f"Answer {i}: " + "the sea is wide and blue " * 5})
    return out


LONG = [{"role": "system", "content": "You are terse."}, *turns(6), {"role": "user", "content": "Say hi"}]


def chat(server: ServerProcess, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": MODEL, "max_tokens": 4, **body},
                      timeout=120)  # fmt: skip


def kept_roles(server: ServerProcess, request_id: str) -> str:
    """The roles the worker kept for this request, from its debug log line."""
    for line in server.log().splitlines():
        if line.startswith("{") and request_id in line and "context truncated: kept" in line:
            return str(json.loads(line)["roles"])
    raise AssertionError(f"no truncation logged for {request_id}")


def test_an_overflowing_chat_is_a_400_by_default_and_answered_with_auto(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=LONG, max_tokens=4)  # type: ignore[arg-type]
    assert e.value.response.json()["code"] == "context_length_exceeded" and f"context is {NCTX}" in str(e.value.body)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=LONG, max_tokens=4,  # type: ignore[arg-type]
                                       extra_body={"truncation": "disabled"})  # fmt: skip
    assert e.value.response.json()["code"] == "context_length_exceeded"

    answer = client.chat.completions.create(model=MODEL, messages=LONG, max_tokens=4,  # type: ignore[arg-type]
                                            extra_body={"truncation": "auto"})  # fmt: skip
    truncated = (answer.model_extra or {})["truncated"]
    # Whole turns went (user and assistant together), and what is left leaves room for the answer.
    assert truncated["messages"] > 0 and truncated["messages"] % 2 == 0 and truncated["tokens"] > 0, truncated
    assert answer.usage is not None and answer.usage.prompt_tokens <= NCTX - 4
    assert answer.choices[0].message.content

    # Streamed: the first chunk says the same.
    chunks = list(client.chat.completions.create(model=MODEL, messages=LONG, max_tokens=4, stream=True,  # type: ignore[arg-type]
                                                 extra_body={"truncation": "auto"}))  # fmt: skip
    assert (chunks[0].model_extra or {}).get("truncated") == truncated
    assert all("truncated" not in (c.model_extra or {}) for c in chunks[1:])


def test_a_conversation_that_fits_says_nothing_and_keeps_every_turn(client: openai.OpenAI) -> None:
    short = [{"role": "system", "content": "You are terse."}, *turns(1), {"role": "user", "content": "Say hi"}]
    answer = client.chat.completions.create(model=MODEL, messages=short, max_tokens=4,  # type: ignore[arg-type]
                                            extra_body={"truncation": "auto"})  # fmt: skip
    assert "truncated" not in (answer.model_extra or {})


def test_the_text_bound_counts_only_what_cannot_be_dropped(server: ServerProcess) -> None:
    """40,000 characters cannot fit 256 tokens and are refused unread by default; with `auto` only
    the system prompt and the last user message must fit, and the rest is dropped."""
    big = [{"role": "system", "content": "Be terse."}, *turns(20, words=90), {"role": "user", "content": "hi"}]
    r = chat(server, messages=big)
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded" and "characters" in r.json()["error"]
    r = chat(server, messages=big, truncation="auto")
    assert r.status_code == 200, r.text[:300]
    assert r.json()["truncated"]["messages"] == 40 and r.json()["usage"]["prompt_tokens"] < 64


def test_a_tool_call_goes_with_its_results(server: ServerProcess) -> None:
    """An early turn with a call and its result, then an agent's loop after the last user message:
    the early turn goes whole, then the oldest round of the loop (a call with its result), and the
    latest round stays with the last user message."""

    def call(call_id: str, words: int) -> list[dict[str, Any]]:
        return [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "look", "arguments": '{"q": "sea"}'}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "result " * words},
        ]  # fmt: skip

    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Look it up."},
        *call("call_1", 150),
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Now the lake."},
        *call("call_2", 60),
        *call("call_3", 20),
    ]
    tools = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]
    r = chat(server, messages=messages, tools=tools)
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded", r.text[:300]
    r = chat(server, messages=messages, tools=tools, truncation="auto")
    assert r.status_code == 200, r.text[:300]
    assert r.json()["truncated"]["messages"] == 6  # user, call_1, its result, "Done."; call_2 and its result
    assert kept_roles(server, r.headers["x-request-id"]) == "system,user,assistant,tool"


def test_what_cannot_be_dropped_must_still_fit(server: ServerProcess) -> None:
    """A system prompt, or a last user message, longer than the context: the same 400 as without."""
    for messages in (
        [{"role": "system", "content": "word " * 300}, *turns(2), {"role": "user", "content": "hi"}],
        [{"role": "system", "content": "hi"}, *turns(2), {"role": "user", "content": "word " * 300}],
    ):
        r = chat(server, messages=messages, truncation="auto")
        assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded", r.text[:300]
        assert f"context is {NCTX}" in r.json()["error"]


def test_responses_truncation_auto(client: openai.OpenAI) -> None:
    items: Any = [{"role": "user", "content": f"Question {i}: " + "tell me about the sea " * 12} for i in range(5)]
    items.append({"role": "user", "content": "Say hi"})
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input=items, max_output_tokens=4)
    assert e.value.response.json()["code"] == "context_length_exceeded"
    r = client.responses.create(model=MODEL, input=items, max_output_tokens=4, truncation="auto")
    assert r.truncation == "auto"
    truncated = (r.model_extra or {})["truncated"]
    assert truncated["messages"] > 0 and truncated["tokens"] > 0 and r.usage and r.usage.input_tokens <= NCTX - 4
    with client.responses.stream(model=MODEL, input=items, max_output_tokens=4, truncation="auto") as s:
        events = list(s)
    assert events[0].type == "response.created" and events[0].response.truncation == "auto"
    assert (events[0].response.model_extra or {})["truncated"] == truncated
    assert (events[-1].response.model_extra or {})["truncated"] == truncated  # type: ignore[union-attr]
    small = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=4)
    assert small.truncation == "disabled" and "truncated" not in (small.model_extra or {})


def test_messages_truncation_auto(server: ServerProcess) -> None:
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)
    messages: Any = LONG[1:]  # the system prompt is a field of its own here
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=4, system="You are terse.", messages=messages)
    m = claude.messages.create(model=MODEL, max_tokens=4, system="You are terse.", messages=messages,
                               extra_body={"truncation": "auto"})  # fmt: skip
    truncated = (m.model_extra or {})["truncated"]
    assert truncated["messages"] > 0 and truncated["messages"] % 2 == 0
    with claude.messages.stream(model=MODEL, max_tokens=4, system="You are terse.", messages=messages,
                                extra_body={"truncation": "auto"}) as s:  # fmt: skip
        first = next(iter(s))
    assert first.type == "message_start" and (first.message.model_extra or {})["truncated"] == truncated


@pytest.mark.parametrize("value", ["Auto", "sometimes", 1, None])
def test_other_truncation_values_are_400s_naming_the_field_and_the_values(server: ServerProcess, value: Any) -> None:
    bodies = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        "/v1/responses": {"input": "hi", "max_output_tokens": 1},
        "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    }
    for path, body in bodies.items():
        r = httpx.post(f"{server.base_url}{path}", json={"model": MODEL, **body, "truncation": value}, timeout=60)
        if value is None:  # null: the server's default
            assert r.status_code == 200, r.text[:300]
            continue
        error = r.json()["error"]
        text = error["message"] if isinstance(error, dict) else error  # Anthropic's shape on /v1/messages
        assert r.status_code == 400 and "`truncation`" in text and "`auto`, `disabled`" in text, (path, r.text)


def test_the_server_default_is_a_setting(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", str(NCTX), "--truncation", "auto")
    r = chat(srv, messages=LONG)
    assert r.status_code == 200 and r.json()["truncated"]["messages"] > 0, r.text[:300]
    r = chat(srv, messages=LONG, truncation="disabled")
    assert r.status_code == 400 and r.json()["code"] == "context_length_exceeded", r.text[:300]
