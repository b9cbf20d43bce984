"""The Anthropic Messages API on the real server and model, driven by the official `anthropic` SDK:
create, the SDK's stream helper, a forced tool call, count_tokens, stop sequences, and errors in
Anthropic's shape. The streamed answer, as the SDK accumulates it, equals the non-streamed one."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.conftest import MODEL, WEATHER_PARAMETERS
from tests.server_proc import ServerProcess

ASK: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "You are a geography teacher."
# The SDK no longer takes sampling parameters as arguments; clients send them in the body.
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}, "max_tokens": 16}
WEATHER = {
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "input_schema": WEATHER_PARAMETERS,
}
TIME = {"name": "get_time", "description": "Local time in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
FORCED: dict[str, Any] = {"tools": [WEATHER, TIME], "tool_choice": {"type": "tool", "name": "get_weather"}}


@pytest.fixture(scope="module")
def claude(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def streamed(claude: anthropic.Anthropic, **kw: Any) -> tuple[list[Any], anthropic.types.Message]:
    """Every event the SDK's stream helper yields, and the message it accumulated."""
    with claude.messages.stream(model=MODEL, **kw) as s:
        events = list(s)
        return events, s.get_final_message()


def test_create_answers_like_chat_and_the_stream_adds_up_to_it(claude: anthropic.Anthropic,
                                                                client: openai.OpenAI) -> None:  # fmt: skip
    m = claude.messages.create(model=MODEL, system=SYSTEM, messages=ASK, **GREEDY)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert 0 < m.usage.output_tokens <= 16
    # the same request through chat completions: one decode path, the same greedy text
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": SYSTEM}, *ASK],
                                       temperature=0, max_tokens=16)  # fmt: skip
    assert c.choices[0].message.content == m.content[0].text
    assert c.usage is not None and c.usage.completion_tokens == m.usage.output_tokens
    assert c.usage.prompt_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)

    events, final = streamed(claude, system=SYSTEM, messages=ASK, **GREEDY)
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content]
    assert (final.stop_reason, final.stop_sequence, final.usage.output_tokens) == (
        m.stop_reason, None, m.usage.output_tokens)  # fmt: skip
    kinds = [e.type for e in events if e.type != "text"]  # "text" is the helper's own convenience event
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


def test_the_raw_stream_is_anthropics_event_sequence(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": ASK, "stream": True, "temperature": 0, "max_tokens": 16}
    with httpx.stream("POST", f"{server.base_url}/v1/messages", json=body, timeout=120,
                      headers={"anthropic-version": "2023-06-01"}) as r:  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data], "every event is named after its type"
    start = data[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert data[-2]["delta"]["stop_reason"] in ("end_turn", "max_tokens") and data[-2]["usage"]["output_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_call_has_an_input_matching_its_schema(claude: anthropic.Anthropic, stream: bool) -> None:
    kw: dict[str, Any] = {"messages": [{"role": "user", "content": "Weather in Paris?"}], **FORCED,
                          "extra_body": {"temperature": 0}, "max_tokens": 60}  # fmt: skip
    m = claude.messages.create(model=MODEL, **kw)
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_") and isinstance(use.input, dict)
    jsonschema.validate(use.input, WEATHER["input_schema"])
    if stream:
        events, final = streamed(claude, **kw)
        (s_use,) = [b for b in final.content if b.type == "tool_use"]
        assert (s_use.name, s_use.input, final.stop_reason) == (use.name, use.input, "tool_use")
        fragments = [e.delta.partial_json for e in events if e.type == "content_block_delta"
                     and e.delta.type == "input_json_delta"]  # fmt: skip
        assert len(fragments) > 1, "the input streams in fragments"
        assert json.loads("".join(fragments)) == use.input


def test_a_tool_conversation_round_trips_through_the_template(claude: anthropic.Anthropic) -> None:
    history: list[Any] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "unit": "celsius"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "22 degrees, sunny"}]},
    ]  # fmt: skip
    m = claude.messages.create(model=MODEL, messages=history, tools=[WEATHER], **GREEDY)
    assert m.content and m.usage.output_tokens > 0
    counted = claude.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
    assert counted.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_count_tokens_is_the_prompt_the_model_reads(claude: anthropic.Anthropic) -> None:
    counted = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK)
    m = claude.messages.create(model=MODEL, system=SYSTEM, messages=ASK, max_tokens=1)
    assert counted.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 5
    with_tools = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK, tools=[WEATHER])
    assert with_tools.input_tokens > counted.input_tokens


def test_a_stop_sequence_is_reported(claude: anthropic.Anthropic) -> None:
    text = claude.messages.create(model=MODEL, messages=ASK, **GREEDY).content[0].text
    words = text.split()
    assert len(words) > 2, text
    stop = words[2]
    m = claude.messages.create(model=MODEL, messages=ASK, stop_sequences=["zzz-never", stop], **GREEDY)
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    assert m.content[0].text == text[: text.index(stop)]
    _, final = streamed(claude, messages=ASK, stop_sequences=[stop], **GREEDY)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


def test_metadata_user_id_goes_to_the_ledger(claude: anthropic.Anthropic, server: ServerProcess) -> None:
    claude.messages.create(model=MODEL, messages=ASK, max_tokens=2, metadata={"user_id": "claude-user-7"})
    rows = httpx.get(f"{server.base_url}/v1/usage", timeout=10).json()["data"]
    # without server keys, the key the SDK sent (as x-api-key) labels the caller, hashed
    label = hashlib.sha256(b"x").hexdigest()[:8]
    assert any(r.get("user") == "claude-user-7" and r.get("key") == label for r in rows), rows


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    assert isinstance(body, dict) and body["type"] == "error", body
    return str(body["error"]["type"])


def test_errors_have_anthropics_shape(claude: anthropic.Anthropic, server: ServerProcess) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        claude.messages.create(model="nobody/nothing:Q4_0", messages=ASK, max_tokens=4)
    assert _error_type(nf.value) == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as missing:
        claude.messages.create(model=MODEL, messages=ASK, max_tokens=anthropic.NOT_GIVEN)  # type: ignore[arg-type]
    assert _error_type(missing.value) == "invalid_request_error" and "max_tokens" in str(missing.value)
    with pytest.raises(anthropic.BadRequestError) as image:
        claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])  # fmt: skip
    assert "image" in str(image.value) and "messages[0].content[0]" in str(image.value)
    for bad in (
        {"extra_body": {"temperature": 1.5}},
        {"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]},
    ):
        with pytest.raises(anthropic.BadRequestError):
            claude.messages.create(model=MODEL, messages=ASK, max_tokens=4, **bad)
    # a prompt the model cannot take is refused before the stream starts: a status, not a broken stream
    long = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(anthropic.BadRequestError) as too_long:
        streamed(claude, messages=long, max_tokens=4)
    assert "context" in str(too_long.value)
    # other routes keep their own shape
    r = httpx.post(
        f"{server.base_url}/v1/chat/completions", json={"model": "nobody/nothing", "messages": ASK}, timeout=10
    )
    assert r.status_code == 404 and isinstance(r.json()["error"], str)


def test_keys_and_their_limits_answer_in_anthropics_shape(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keys = tmp_path / "keys"
    keys.write_text("sk-ant-good-0123456789 claude rpm=2\n")
    srv = start("--nctx", "1024", "--api-key-file", str(keys))
    bad = anthropic.Anthropic(base_url=srv.base_url, api_key="sk-wrong-0123456789", max_retries=0, timeout=60)
    with pytest.raises(anthropic.AuthenticationError) as auth:
        bad.messages.count_tokens(model=MODEL, messages=ASK)
    assert _error_type(auth.value) == "authentication_error"
    good = anthropic.Anthropic(base_url=srv.base_url, api_key="sk-ant-good-0123456789", max_retries=0, timeout=60)
    assert good.messages.count_tokens(model=MODEL, messages=ASK).input_tokens > 0  # sent as x-api-key
    good.messages.count_tokens(model=MODEL, messages=ASK)
    with pytest.raises(anthropic.RateLimitError) as limited:
        good.messages.count_tokens(model=MODEL, messages=ASK)
    assert _error_type(limited.value) == "rate_limit_error" and limited.value.response.headers["retry-after"]


def test_structured_output_follows_its_schema(claude: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}  # fmt: skip
    m = claude.messages.create(model=MODEL, messages=ASK, output_config={"format": {"type": "json_schema", "schema": schema}},
                               extra_body={"temperature": 0}, max_tokens=40)  # fmt: skip
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_thinking_runs_the_reasoning_split_and_the_stream_still_adds_up(claude: anthropic.Anthropic) -> None:
    """SmolLM2 never thinks, so this proves the path (split on, shaped piece by piece), not the blocks:
    gateway/dialects/anthropic/translate.py's unit tests show reasoning becoming thinking blocks."""
    kw: dict[str, Any] = {"messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 1024}, **GREEDY}
    m = claude.messages.create(model=MODEL, **kw)
    _, final = streamed(claude, **kw)
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content]
    assert m.content and all(b.type in ("thinking", "text") for b in m.content)


STORY = "Write a long story about a dragon who learns to bake bread."


def test_a_thinking_budget_closes_the_thinking_block(claude: anthropic.Anthropic, client: openai.OpenAI,
                                                     thinking_model: str) -> None:  # fmt: skip
    """`budget_tokens` on a model inside a thinking section (tests/thinking_model.py): its thinking is
    the 8 tokens chat completions' `thinking_budget_tokens: 8` gives (same prompt, greedy), then text."""
    chat = client.chat.completions.create(model=thinking_model, messages=[{"role": "user", "content": STORY}],
                                          max_tokens=30, temperature=0,
                                          extra_body={"thinking_budget_tokens": 8, "reasoning_format": "deepseek"})  # fmt: skip
    assert chat.usage.completion_tokens_details.reasoning_tokens == 8  # type: ignore[union-attr]
    kw: dict[str, Any] = {"model": thinking_model, "messages": [{"role": "user", "content": STORY}], "max_tokens": 30,
                          "extra_body": {"temperature": 0}, "thinking": {"type": "enabled", "budget_tokens": 8}}  # fmt: skip
    m = claude.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == chat.choices[0].message.reasoning_content  # type: ignore[union-attr, attr-defined]
    assert m.content[1].text == chat.choices[0].message.content  # type: ignore[union-attr]
    with claude.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content]
    off = claude.messages.create(**{**kw, "thinking": {"type": "disabled"}})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text  # type: ignore[union-attr]


def test_a_bad_thinking_budget_is_a_400_naming_it(server: ServerProcess) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": -1}}  # fmt: skip
    r = httpx.post(f"{server.base_url}/v1/messages", json=body, timeout=30)
    assert r.status_code == 400 and "thinking.budget_tokens" in r.json()["error"]["message"]
