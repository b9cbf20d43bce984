"""The Anthropic Messages dialect's translation, both ways, without a server: requests into the chat
request (and so the chat plan), chat answers into content blocks, and shaper pieces into events."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest

from gateway.chat.convert import Shape
from gateway.chat.shape import ChoiceShaper
from gateway.chat.tool_calls import arguments_object as tool_input
from gateway.dialects.anthropic.translate import (
    BlockStream,
    blocks_of,
    chat_request,
    image_fields,
    message_of,
    not_offered,
    stop_reason,
)
from gateway.errors import BadRequest
from gateway.http.error_body import anthropic_error, error_body, speaks_anthropic
from protocol import anthropic as a
from protocol import chat
from protocol.limits import MAX_STOP


def request(**fields: Any) -> a.MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.json.decode(json.dumps(body), type=a.MessagesRequest)


WEATHER = {"name": "weather", "description": "the weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


def test_system_text_and_sampling_map_to_the_chat_request() -> None:
    r = chat_request(request(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
                             stop_sequences=["END"], temperature=0.0, top_p=0.5, top_k=3,
                             metadata={"user_id": "ada"}, stream=True))  # fmt: skip
    assert [(m.role, m.content) for m in r.messages] == [("system", "Be brief.\nBe kind."), ("user", "hi")]
    assert (r.max_tokens, r.stop, r.temperature, r.top_p, r.top_k, r.user, r.stream) == (
        8,
        ["END"],
        0.0,
        0.5,
        3,
        "ada",
        True,
    )
    assert r.enable_think is False and r.reasoning_format is None  # Anthropic models think only when asked


def test_thinking_asks_the_template_and_splits_reasoning() -> None:
    r = chat_request(request(thinking={"type": "enabled", "budget_tokens": 1024}))
    assert r.enable_think is True and r.reasoning_format == "deepseek"


def test_a_tool_conversation_becomes_tool_calls_and_tool_messages() -> None:
    r = chat_request(request(tools=[WEATHER], tool_choice={"type": "any"}, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call it.", "signature": "sig"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down", "is_error": True},
            {"type": "text", "text": "Thanks!"},
        ]},
    ]))  # fmt: skip
    roles = [m.role for m in r.messages]
    assert roles == ["user", "assistant", "tool", "tool", "user"]
    assistant = r.messages[1]
    assert assistant.content == "Let me check." and assistant.reasoning_content == "I should call it."
    assert assistant.tool_calls is not None
    call = assistant.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "toolu_1",
        "weather",
        {"city": "Paris"},
    )
    assert (r.messages[2].tool_call_id, r.messages[2].content) == ("toolu_1", "sunny")
    assert r.messages[3].content == "Error: down"
    assert r.tools is not None and r.tools[0].function.parameters == WEATHER["input_schema"]
    assert r.tool_choice == "required"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [({"type": "auto"}, "auto"), ({"type": "none"}, "none"), ({"type": "any"}, "required"),
     ({"type": "tool", "name": "weather"}, {"type": "function", "function": {"name": "weather"}})],
)  # fmt: skip
def test_tool_choice_maps_to_the_chat_choice(choice: dict[str, Any], expected: object) -> None:
    assert chat_request(request(tools=[WEATHER], tool_choice=choice)).tool_choice == expected


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "`tool_choice.name`"),
        ({"tool_choice": {"type": "any"}}, "`tool_choice`"),
        ({"tools": [WEATHER, {"name": "web_search", "type": "web_search_20250305"}],
          "tool_choice": {"type": "tool", "name": "web_search"}}, "`tool_choice.name`"),
        ({"tools": [{"name": "bash", "type": "bash_20250124"}], "tool_choice": {"type": "any"}}, "`tool_choice`"),
        ({"tools": [{"name": "f"}]}, "`tools[0].input_schema`"),
        ({"messages": [{"role": "user", "content": []}]}, "`messages[0].content`"),
        ({"tools": [WEATHER], "tool_choice": {"type": "any"},
          "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "`output_config.format`"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "x"}}]}]},
         "`messages[0].content[0].source.type`"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
         "`messages[0].content[0].source`"),
        ({"messages": [{"role": "assistant", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
         "`messages[0].content[0]`"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
         "`messages[0].content[0]`"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
         "`messages[0].content[0]`"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_anthropic_field(fields: dict[str, Any], names: str) -> None:
    with pytest.raises(BadRequest, match="^" + re.escape(names)):
        chat_request(request(**fields))


def test_answers_become_blocks_in_stream_order() -> None:
    msg = chat.AssistantMessage(role="assistant", content="Checking.", reasoning_content="hmm", tool_calls=[
        chat.ToolCall(id="call_abc", function=chat.FunctionCall(name="weather", arguments='{"city": "Paris"}'))])  # fmt: skip
    blocks = blocks_of(msg)
    assert blocks == [a.ThinkingBlock("hmm"), a.TextBlock("Checking."),
                      a.ToolUseBlock(id="toolu_abc", name="weather", input={"city": "Paris"})]  # fmt: skip
    assert tool_input("[1, 2]") == {} and tool_input('{"a": ') == {}  # `input` is always an object


def test_stop_reasons() -> None:
    assert stop_reason("tool_calls", "") == "tool_use"
    assert stop_reason("length", "") == "max_tokens"
    assert stop_reason("stop", "END") == "stop_sequence"
    assert stop_reason("stop", "") == "end_turn"


def test_a_completion_becomes_a_message_with_cache_reads_apart() -> None:
    usage = chat.Usage(prompt_tokens=30, completion_tokens=5, total_tokens=35,
                       prompt_tokens_details=chat.PromptTokensDetails(cached_tokens=20))  # fmt: skip
    choice = chat.Choice(index=0, message=chat.AssistantMessage(role="assistant", content="Hi"), finish_reason="stop")
    m = message_of(chat.ChatCompletion(id="msg-0123", created=0, model="m", choices=[choice], usage=usage), "END")
    body = json.loads(msgspec.json.encode(m))
    assert body == {
        "id": "msg_0123", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "Hi"}], "stop_reason": "stop_sequence", "stop_sequence": "END",
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 20},
    }  # fmt: skip


def events_of(shaper: ChoiceShaper, pieces: list[str]) -> list[dict[str, Any]]:
    blocks = BlockStream()
    events: list[a.StreamEvent] = []
    for p in pieces:
        if (piece := shaper.feed(p)) is not None:
            events += blocks.feed(piece[0])
    if (tail := shaper.finish()) is not None:
        events += blocks.feed(tail[0])
    events += blocks.finish()
    return [json.loads(msgspec.json.encode(e)) for e in events]


def test_a_streamed_tool_call_is_one_block_whose_fragments_make_its_input() -> None:
    text = 'Sure.<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
    events = events_of(ChoiceShaper(0, Shape(tools=frozenset({"weather"})), "hermes"),
                       [text[i : i + 4] for i in range(0, len(text), 4)])  # fmt: skip
    kinds = [e["type"] for e in events]
    assert kinds[0] == "content_block_start" and events[0]["content_block"] == {"type": "text", "text": ""}
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1]
    tool = starts[1]["content_block"]
    assert tool["type"] == "tool_use" and tool["name"] == "weather" and tool["id"].startswith("toolu_")
    assert tool["input"] == {}
    fragments = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta" and e["index"] == 1]
    assert json.loads("".join(fragments)) == {"city": "Paris"}
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1]
    assert kinds.count("content_block_stop") == 2 and kinds[-1] == "content_block_stop"


def test_streamed_reasoning_is_a_thinking_block_before_the_text() -> None:
    events = events_of(ChoiceShaper(0, Shape(reasoning=True)), ["<think>", "let me", " see", "</think>", "4."])
    deltas = [(e["index"], e["delta"]) for e in events if e["type"] == "content_block_delta"]
    assert "".join(d["thinking"] for i, d in deltas if i == 0) == "let me see"
    assert "".join(d["text"] for i, d in deltas if i == 1) == "4."
    assert events[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}


def test_errors_take_anthropic_shape_on_messages_routes_only() -> None:
    assert speaks_anthropic("/v1/messages") and speaks_anthropic("/v1/messages/count_tokens")
    assert not speaks_anthropic("/v1/messagesx") and not speaks_anthropic("/v1/chat/completions")
    status, body = error_body("/v1/messages", 404, "no such model")
    assert (status, json.loads(body)) == (404, {"type": "error", "error": {"type": "not_found_error", "message": "no such model"}})  # fmt: skip
    assert anthropic_error(503, "busy")[0] == 529 and anthropic_error(503, "busy")[1].error.type == "overloaded_error"
    assert anthropic_error(401, "key")[1].error.type == "authentication_error"
    assert anthropic_error(429, "slow")[1].error.type == "rate_limit_error"
    assert anthropic_error(415, "json")[1].error.type == "invalid_request_error"
    assert anthropic_error(500, "bug")[1].error.type == "api_error"
    assert json.loads(error_body("/v1/chat/completions", 404, "no such model")[1]) == {"error": "no such model"}


def test_max_tokens_is_required() -> None:
    with pytest.raises(msgspec.ValidationError, match="max_tokens"):
        msgspec.json.decode(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}', type=a.MessagesRequest)


class _Books:
    """An Accounting stand-in: what the stream counts, and how it ended."""

    def __init__(self) -> None:
        self.settled: list[tuple[str, int, int]] = []

    def first_token(self) -> None:
        pass

    def running(self) -> None:
        pass

    def energy_j(self) -> float | None:
        return None

    def settle(self, outcome: str, prompt: int, completion: int, cached: int = 0) -> None:
        self.settled.append((outcome, prompt, completion))


async def _sse(items: list[object], fail: Exception | None = None) -> tuple[list[tuple[str, dict[str, Any]]], _Books]:
    from gateway.dialects.anthropic.stream import sse
    from gateway.http.relay import Completion

    async def rest() -> Any:
        for item in items[1:]:
            yield 0, item
        if fail is not None:
            raise fail

    books = _Books()
    c = Completion("m", books, id_prefix="msg")  # type: ignore[arg-type]
    out = [(m.event, json.loads(m.data)) async for m in sse(c, ChoiceShaper(0, Shape()), (0, items[0]), rest())]
    assert all(name == data["type"] for name, data in out), "every event is named after its type"
    return out, books


async def test_the_stream_is_anthropics_sequence_and_reports_the_stop_sequence() -> None:
    from protocol.wire import Delta, Done, Started

    events, books = await _sse([Started(1, 12, cached_tokens=8), Delta(1, "Hello", 1), Delta(1, " there", 2),
                                Done(1, "stop", prompt_tokens=12, completion_tokens=2, cached_tokens=8, stop_sequence="!")])  # fmt: skip
    names = [n for n, _ in events]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["usage"]["input_tokens"] == 4
    assert start["usage"]["cache_read_input_tokens"] == 8
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == "Hello there"
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "!"}
    assert delta["usage"] == {"output_tokens": 2, "input_tokens": 4, "cache_read_input_tokens": 8}
    assert books.settled == [("ok", 12, 2)]


async def test_an_error_mid_stream_is_an_error_event() -> None:
    from gateway.errors import WorkerDied
    from protocol.wire import Delta, Started

    events, books = await _sse(
        [Started(1, 12), Delta(1, "Hel", 1)], WorkerDied("worker for m died (killed by SIGKILL)")
    )
    assert [n for n, _ in events][-1] == "error"
    assert events[-1][1]["error"] == {"type": "api_error", "message": "worker for m died (killed by SIGKILL)"}
    assert books.settled == [("error", 0, 1)]


def test_the_chat_endpoints_bounds_hold_here_too() -> None:
    with pytest.raises(msgspec.ValidationError, match="stop_sequences"):
        request(stop_sequences=["x"] * (MAX_STOP + 1))
    with pytest.raises(msgspec.ValidationError, match="stop_sequences"):
        request(stop_sequences=["x" * 1025])
    with pytest.raises(msgspec.ValidationError, match="tools"):
        request(tools=[WEATHER] * 129)


def test_image_blocks_become_image_url_parts_in_their_order() -> None:
    """A user turn's text and images keep their order as chat content parts; errors about an image
    name the Anthropic block (image_fields), and a tool result after them starts its own message."""
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    req = request(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "compare"}, {"type": "image", "source": png},
                                     {"type": "text", "text": "and"}, {"type": "text", "text": "this"},
                                     {"type": "image", "source": {"type": "url", "url": "https://example.org/a.jpg"}}]},
    ])  # fmt: skip
    messages = chat_request(req).messages
    content = messages[-1].content
    assert isinstance(content, list)
    assert [(p.type, p.text, p.image_url.url if p.image_url else None) for p in content] == [
        ("text", "compare", None),
        ("image_url", None, "data:image/png;base64,iVBORw0KGgo="),
        ("text", "and\nthis", None),
        ("image_url", None, "https://example.org/a.jpg"),
    ]
    assert image_fields(req) == ["messages[2].content[1]", "messages[2].content[4]"]
    assert chat_request(request()).messages[0].content == "hi", "text-only turns stay plain strings"


def test_anthropics_own_tools_are_not_offered_and_are_named() -> None:
    tools = [WEATHER, {"name": "web_search", "type": "web_search_20250305", "max_uses": 5},
             {"name": "bash", "type": "bash_20250124"}]  # fmt: skip
    r = chat_request(request(tools=tools))
    assert [t.function.name for t in r.tools or []] == ["weather"]
    assert not_offered(msgspec.convert(tools, list[a.ToolDef])) == [
        "web_search_20250305 (web_search, tools[1])", "bash_20250124 (bash, tools[2])"]  # fmt: skip
    only = chat_request(request(tools=tools[1:], tool_choice={"type": "auto"}))
    assert only.tools is None and only.tool_choice is None, "nothing left to offer: a plain answer"


def test_disable_parallel_tool_use_allows_one_call() -> None:
    r = chat_request(request(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True}))
    assert r.parallel_tool_calls is False
    assert chat_request(request(tools=[WEATHER])).parallel_tool_calls is None


def test_a_system_turn_among_the_messages_joins_the_system_prompt() -> None:
    r = chat_request(request(system="You help.", messages=[
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "Today is Monday.", "cache_control": {"type": "ephemeral"}}]},
    ]))  # fmt: skip
    assert [(m.role, m.content) for m in r.messages] == [("system", "You help.\n\nToday is Monday."), ("user", "hi")]
    with pytest.raises(BadRequest, match=re.escape("`messages[0].content[0]`")):
        chat_request(request(messages=[{"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]))


def test_a_deferred_tool_is_offered_and_a_tool_reference_read() -> None:
    deferred = {**WEATHER, "name": "later", "defer_loading": True}
    r = chat_request(request(tools=[WEATHER, deferred], messages=[
        {"role": "user", "content": "find a tool"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "tool_reference", "tool_name": "later"}]}]},
    ]))  # fmt: skip
    assert [t.function.name for t in r.tools or []] == ["weather", "later"]
    assert r.messages[-1].role == "tool" and r.messages[-1].content == "Tool loaded: later"
