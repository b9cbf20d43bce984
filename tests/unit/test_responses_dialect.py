"""The Responses dialect without a model: input items into chat messages, settings into the chat
request, the answer's pieces into output items and events (validated as the openai SDK's types),
and the response store (SQLite, per owner, bounded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from gateway.dialects.responses.events import OutputStream
from gateway.dialects.responses.store import Limits, ResponseStore
from gateway.dialects.responses.translate import (
    answer_messages,
    chat_messages,
    chat_request,
    image_fields,
    input_items,
    skeleton,
    wants_summary,
)
from gateway.errors import BadRequest
from protocol import chat
from protocol import responses as r

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
ADD = {"type": "function", "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}


def request(**kw: Any) -> r.ResponsesRequest:
    return msgspec.convert({"model": "m", "input": "hi", **kw}, r.ResponsesRequest)


def messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(m) for m in chat_messages(input_items(items))]


def test_a_string_is_one_user_message_and_instructions_are_the_system_turn() -> None:
    t = chat_request(request(instructions="Be brief."), [])
    req, conversation = t.request, t.conversation
    assert [(m.role, m.content) for m in req.messages] == [("system", "Be brief."), ("user", "hi")]
    assert [(m.role, m.content) for m in conversation] == [("user", "hi")], "instructions are not carried over"


def test_items_become_chat_turns_with_the_assistants_pieces_in_one_message() -> None:
    out = messages([
        {"role": "developer", "content": "rules"},
        {"content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}], "role": "user"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 2}'},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2"}]},
        {"role": "assistant", "content": "Done."},
        {"role": "assistant", "content": "Twice."},
    ])  # fmt: skip
    assert out == [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "Let me add.", "reasoning_content": "hmm", "tool_calls": [
            {"id": "c1", "function": {"name": "add", "arguments": '{"a": 1}'}, "type": "function"},
            {"id": "c2", "function": {"name": "add", "arguments": '{"a": 2}'}, "type": "function"}]},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
        {"role": "tool", "content": "2", "tool_call_id": "c2"},
        {"role": "assistant", "content": "Done."},
        {"role": "assistant", "content": "Twice."},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("items", "named"),
    [
        (
            [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}],
            "`input[0].content[0].image_url`",
        ),
        ([{"role": "assistant", "content": [{"type": "input_image", "image_url": "x"}]}], "`input[0].content[0]`"),
        ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "`input[0].content[0]`"),
        ([{"role": "user", "content": "x"}, {"type": "item_reference", "id": "m"}], "`input[1].type`"),
        ([{"type": "function_call_output", "output": "1"}], "`call_id`"),
        ([{"role": "robot", "content": "x"}], "`input[0].role`"),
        ([{"content": "x"}], "`type`"),
    ],
)
def test_bad_items_are_refused_naming_where(items: list[dict[str, Any]], named: str) -> None:
    with pytest.raises(BadRequest, match=named.replace("[", r"\[").replace("]", r"\]")):
        chat_messages(input_items(items))


def test_settings_map_to_the_chat_request() -> None:
    req = chat_request(request(max_output_tokens=7, temperature=0.5, top_p=0.9, user="u", tools=[ADD],
                                  tool_choice={"type": "function", "name": "add"},
                                  reasoning={"effort": "none"}), []).request  # fmt: skip
    assert (req.max_completion_tokens, req.temperature, req.top_p, req.user) == (7, 0.5, 0.9, "u")
    assert req.tool_choice == {"type": "function", "function": {"name": "add"}}
    assert req.tools is not None and req.tools[0].function.name == "add"
    assert (req.enable_think, req.reasoning_format) == (False, "deepseek")
    assert chat_request(request(reasoning={"effort": "high"}), []).request.enable_think is True
    assert chat_request(request(), []).request.enable_think is None, "without `reasoning`: the template's default"
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    fmt = chat_request(request(text={"format": {"type": "json_schema", "name": "n", "schema": schema}}), []).request
    assert fmt.response_format == {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    assert chat_request(request(text={"format": {"type": "json_object"}}), []).request.response_format == {
        "type": "json_object"}  # fmt: skip
    assert chat_request(request(text={"format": {"type": "text"}}), []).request.response_format is None


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        ({"tools": [ADD], "tool_choice": {"type": "function", "name": "sub"}}, "tool_choice.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [ADD], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"tools": [{**ADD, "parameters": {"type": "object", "maximum": 2**70}}]}, "tools[0].parameters"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(kw: dict[str, Any], named: str) -> None:
    with pytest.raises(BadRequest, match=named.replace("[", r"\[").replace("]", r"\]")):
        chat_request(request(**kw), [])


def test_history_comes_before_the_new_input() -> None:
    history = [chat.ChatMessage(role="user", content="a"), chat.ChatMessage(role="assistant", content="b")]
    t = chat_request(request(input="c", instructions="sys"), history)
    req, conversation = t.request, t.conversation
    assert [m.content for m in req.messages] == ["sys", "a", "b", "c"]
    assert [m.content for m in conversation] == ["a", "b", "c"]


def _stream(**kw: Any) -> OutputStream:
    req = request(**kw)
    tools = chat_request(req, []).tools
    return OutputStream(skeleton(req, tools, "resp_1", 1700000000, "m", 0.8, 0.95), tools, wants_summary(req))


def _usage(prompt: int, completion: int, cached: int = 0) -> chat.Usage:
    return chat.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                      prompt_tokens_details=chat.PromptTokensDetails(cached_tokens=cached))  # fmt: skip


def _validate(events: list[r.StreamEvent]) -> list[str]:
    for ev in events:
        EVENTS.validate_json(msgspec.json.encode(ev))
    return [ev.__struct_config__.tag for ev in events]  # type: ignore[misc]


def test_reasoning_text_and_calls_become_items_and_valid_events() -> None:
    out = _stream(tools=[ADD])
    events = out.start()
    events += out.feed(chat.ChunkDelta(reasoning_content="think "), 2)
    events += out.feed(chat.ChunkDelta(reasoning_content="more", content="Sure."), 6)
    events += out.feed(chat.ChunkDelta(tool_calls=[chat.ChunkToolCall(index=0, id="call_x", type="function",
                       function=chat.ChunkFunction(name="add", arguments=""))]), 8)  # fmt: skip
    events += out.feed(chat.ChunkDelta(tool_calls=[chat.ChunkToolCall(index=0, function=chat.ChunkFunction(arguments='{"a"'))]), 9)  # fmt: skip
    events += out.feed(chat.ChunkDelta(tool_calls=[chat.ChunkToolCall(index=0, function=chat.ChunkFunction(arguments=": 1}"))]), 10)  # fmt: skip
    events += out.finish("stop", _usage(20, 10, cached=5))
    kinds = _validate(events)
    assert kinds == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = Response.model_validate_json(msgspec.json.encode(out.response))
    assert final.status == "completed" and final.output_text == "Sure."
    rs, msg, call = final.output
    assert msg.type == "message" and msg.status == "completed"
    assert rs.type == "reasoning" and rs.content is not None and rs.content[0].text == "think more"
    assert call.type == "function_call" and (call.call_id, call.id, call.arguments) == ("call_x", "fc_x", '{"a": 1}')
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens == 5
    # 2 tokens of pure reasoning, then 4 split by characters (4 of reasoning, 5 of text): 2 + round(4 * 4 / 9)
    assert final.usage.output_tokens_details.reasoning_tokens == 4
    assert final.tools[0].type == "function" and final.tools[0].name == "add"
    # the answer as the assistant turn a continuation reads
    (again,) = answer_messages(out.response.output)
    assert (again.content, again.reasoning_content) == ("Sure.", "think more")
    assert again.tool_calls == [chat.ToolCall(id="call_x", function=chat.FunctionCall("add", '{"a": 1}'))]


def test_a_cut_answer_is_incomplete_and_a_broken_one_failed() -> None:
    out = _stream()
    events = out.start() + out.text("Once") + out.text(" upon") + out.finish("length", _usage(5, 2))
    assert _validate(events)[-1] == "response.incomplete"
    final = Response.model_validate_json(msgspec.json.encode(out.response))
    assert final.status == "incomplete" and final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens" and final.output[0].status == "incomplete"
    assert final.output_text == "Once upon"
    broken = _stream()
    events = broken.start() + broken.text("x") + broken.fail("the worker died")
    assert _validate(events)[-1] == "response.failed"
    failed = Response.model_validate_json(msgspec.json.encode(broken.response))
    assert failed.status == "failed" and failed.error is not None and failed.error.message == "the worker died"


def test_an_empty_answer_is_one_empty_assistant_turn() -> None:
    assert answer_messages([]) == [chat.ChatMessage(role="assistant", content="")]


def _response(i: int) -> r.Response:
    return r.Response(id=f"resp_{i}", created_at=0, status="completed", model="m", output=[])


async def test_the_store_is_per_owner_bounded_by_count_and_bytes_and_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite3"
    store = ResponseStore(path, Limits(responses=3, response_bytes=10_000))
    await store.open()
    turn = [chat.ChatMessage(role="user", content="x")]
    evicted = [i for n in range(4) for i in await store.put("alice", _response(n), [], turn)]
    assert evicted == ["resp_0"] and await store.get("alice", "resp_0") is None, "the oldest goes first"
    assert await store.get("bob", "resp_1") is None, "another caller sees nothing"
    assert not await store.delete("bob", "resp_1")
    await store.put("bob", _response(9), [], turn)
    assert await store.get("bob", "resp_9") is not None and await store.get("alice", "resp_1") is not None, \
        "one owner's bound is its own"  # fmt: skip
    found = await store.get("alice", "resp_1")
    assert found is not None and found.conversation == turn and found.response.id == "resp_1"
    big = [chat.ChatMessage(role="user", content="y" * 4000)]
    for n in range(3):
        await store.put("alice", _response(10 + n), [], big)
    assert await store.get("alice", "resp_10") is None and await store.get("alice", "resp_12") is not None, \
        "the bytes held are bounded too"  # fmt: skip
    count, size = await store.stats()
    assert size <= 10_000 + 1_000 and count <= 3, "(alice's two large ones, bob's small one)"
    assert await store.put("alice", _response(7), [], [chat.ChatMessage(role="user", content="z" * 20_000)]) == []
    assert await store.get("alice", "resp_7") is None, "one larger than the store is not kept"
    running = msgspec.structs.replace(_response(8), status="in_progress")
    await store.put("alice", running, [], [])
    await store.close()
    reopened = ResponseStore(path, Limits(responses=3, response_bytes=10_000))
    assert await reopened.open() == ["resp_8"]
    kept = await reopened.get("alice", "resp_8")
    assert kept is not None and kept.response.status == "failed" and kept.response.error is not None
    assert await reopened.get("bob", "resp_9") is not None, "a restart keeps what was stored"
    await reopened.close()


def test_input_image_parts_become_image_url_parts_in_their_order() -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": "what colour?"},
                                          {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]}]  # fmt: skip
    (message,) = chat_messages(input_items(items))
    assert isinstance(message.content, list)
    assert [(p.type, p.text) for p in message.content] == [("text", "what colour?"), ("image_url", None)]
    image = message.content[1].image_url
    assert image is not None and image.url == "data:image/png;base64,AAAA" and image.detail == "low"
    req = msgspec.convert({"model": "m", "input": [{"role": "user", "content": "hi"}, *items]}, r.ResponsesRequest)
    assert image_fields(req) == ["input[1].content[1]"]


# ---- tools as agent CLIs send them: namespaces and hosted tools -------------------------------

SPAWN = {"type": "function", "name": "spawn_agent", "description": "Start a helper.",
         "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}  # fmt: skip
AGENTS = {"type": "namespace", "name": "agents", "description": "Helpers you can start.", "tools": [SPAWN]}


def test_a_namespaces_functions_are_offered_as_namespace_dot_name() -> None:
    t = chat_request(request(tools=[ADD, AGENTS, {"type": "web_search", "external_web_access": False}]), [])
    assert [tool.function.name for tool in t.request.tools or []] == ["add", "agents.spawn_agent"]
    spawn = (t.request.tools or [])[1].function
    assert spawn.description == "(Helpers you can start.) Start a helper." and spawn.parameters == SPAWN["parameters"]
    assert t.tools.split("agents.spawn_agent") == ("agents", "spawn_agent") and t.tools.split("add") == (None, "add")
    assert t.tools.not_offered == ["web_search (tools[2])"]
    assert [e["type"] for e in t.tools.echo] == ["function", "namespace"], "the echo holds what the model was offered"


def test_a_namespaced_call_goes_out_with_its_namespace_and_comes_back_in() -> None:
    out = _stream(tools=[ADD, AGENTS])
    events = out.start()
    events += out.feed(chat.ChunkDelta(tool_calls=[chat.ChunkToolCall(index=0, id="call_s", type="function",
                       function=chat.ChunkFunction(name="agents.spawn_agent", arguments='{"task": "x"}'))]), 5)  # fmt: skip
    events += out.finish("tool_calls", _usage(10, 5))
    _validate(events)
    added = next(e for e in events if isinstance(e, r.ItemAdded))
    assert isinstance(added.item, r.FunctionCall) and (added.item.name, added.item.namespace) == (
        "spawn_agent",
        "agents",
    )
    final = Response.model_validate_json(msgspec.json.encode(out.response))
    (call,) = final.output
    assert call.type == "function_call" and (call.name, call.namespace) == ("spawn_agent", "agents")
    top = _stream(tools=[ADD])
    top.feed(chat.ChunkDelta(tool_calls=[chat.ChunkToolCall(index=0, id="call_a", type="function",
             function=chat.ChunkFunction(name="add", arguments="{}"))]), 1)  # fmt: skip
    top.finish("tool_calls", _usage(1, 1))
    assert "namespace" not in msgspec.json.decode(msgspec.json.encode(top.response))["output"][0], "absent, not null"
    # the stored answer, and a client's own function_call item, read back as the name the model saw
    assert answer_messages(out.response.output)[0].tool_calls[0].function.name == "agents.spawn_agent"  # type: ignore[index]
    item = {"type": "function_call", "call_id": "c", "name": "spawn_agent", "namespace": "agents", "arguments": "{}"}
    assert messages([item])[0]["tool_calls"][0]["function"]["name"] == "agents.spawn_agent"


@pytest.mark.parametrize(
    ("choice", "seen"),
    [
        ({"type": "function", "name": "agents.spawn_agent"}, "agents.spawn_agent"),
        ({"type": "function", "name": "spawn_agent", "namespace": "agents"}, "agents.spawn_agent"),
        ({"type": "function", "name": "spawn_agent"}, "agents.spawn_agent"),
        ({"type": "function", "name": "add"}, "add"),
    ],
)
def test_a_namespaced_function_can_be_forced(choice: dict[str, Any], seen: str) -> None:
    t = chat_request(request(tools=[ADD, AGENTS], tool_choice=choice), [])
    assert t.request.tool_choice == {"type": "function", "function": {"name": seen}}


def test_allowed_tools_narrows_the_offer() -> None:
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "namespace", "name": "agents"},
                                                                      {"type": "web_search"}]}  # fmt: skip
    t = chat_request(request(tools=[ADD, AGENTS, {"type": "web_search"}], tool_choice=choice), [])
    assert [tool.function.name for tool in t.request.tools or []] == ["agents.spawn_agent"]
    assert t.request.tool_choice == "required" and len(t.tools.echo) == 2, "the echo keeps every offered tool"


def test_only_hosted_tools_is_a_plain_answer_and_forcing_one_a_400() -> None:
    t = chat_request(request(tools=[{"type": "web_search"}, {"type": "code_interpreter", "container": {}}]), [])
    assert t.request.tools is None and t.request.tool_choice is None and len(t.tools.not_offered) == 2
    with pytest.raises(BadRequest, match=r"`tool_choice.type`: forces 'web_search_preview'"):
        chat_request(
            request(tools=[ADD, {"type": "web_search_preview"}], tool_choice={"type": "web_search_preview"}), []
        )
    with pytest.raises(BadRequest, match=r"`tool_choice`: `required` needs a function tool in `tools` \(web_search"):
        chat_request(request(tools=[{"type": "web_search"}], tool_choice="required"), [])


@pytest.mark.parametrize(
    ("tools", "named"),
    [
        (
            [{"type": "namespace", "name": "n", "tools": [{**SPAWN, "name": f"f{i}"} for i in range(10_000)]}],
            "tools[0].tools",
        ),
        (
            [{"type": "namespace", "name": "n", "tools": [{"type": "namespace", "name": "m", "tools": [SPAWN]}]}],
            "tools[0].tools[0].type",
        ),
        ([{**AGENTS, "name": "a\x00b"}], "tools[0].name"),
        ([{**AGENTS, "name": "a.b"}], "tools[0].name"),
        ([{"type": "namespace", "name": "n", "tools": [{**SPAWN, "name": "x\x00"}]}], "tools[0].tools[0].name"),
        ([{"type": "namespace", "name": "n", "tools": []}], "tools[0].tools"),
        ([AGENTS, {**ADD, "name": "agents.spawn_agent"}], "tools[1].name"),
        ([{**ADD, "name": "agents.spawn_agent"}, AGENTS], "tools[1].tools[0].name"),
        ([ADD, ADD], "tools[1].name"),
        (
            [
                {"type": "namespace", "name": "n", "tools": [{**SPAWN, "name": f"f{i}"} for i in range(100)]},
                {"type": "namespace", "name": "m", "tools": [{**SPAWN, "name": f"f{i}"} for i in range(100)]},
            ],
            "tools",
        ),
        ([{"type": "x" * 10_000}], "tools[0].type"),
    ],
)
def test_hostile_tools_are_400s_naming_the_tool(tools: list[dict[str, Any]], named: str) -> None:
    """Each is refused by decoding (the server's 400 names `$.tools[...]`) or by the translation."""
    with pytest.raises((BadRequest, msgspec.ValidationError)) as refused:
        chat_request(request(tools=tools), [])
    message = str(refused.value)
    assert f"`{named}`" in message or f"`$.{named}`" in message, message


def test_an_unknown_tool_type_is_not_offered_and_named() -> None:
    t = chat_request(request(tools=[ADD, {"type": "holodeck_2031", "name": "h"}]), [])
    assert [tool.function.name for tool in t.request.tools or []] == ["add"]
    assert t.tools.not_offered == ["holodeck_2031 (tools[1])"]


def test_prompt_cache_key_narrows_the_cache_within_the_caller() -> None:
    assert chat_request(request(), []).request.cache_salt is None
    a, b = (chat_request(request(prompt_cache_key=k), []).request.cache_salt for k in ("s1", "s2"))
    assert a and b and a != b
    assert chat_request(request(prompt_cache_key="s1", cache_salt="x"), []).request.cache_salt not in (a, b)


def test_a_reasoning_summary_carries_the_reasoning_and_is_streamed() -> None:
    out = _stream(reasoning={"summary": "auto"})
    events = out.start() + out.feed(chat.ChunkDelta(reasoning_content="hmm"), 1) + out.text("ok")
    events += out.finish("stop", _usage(3, 2))
    kinds = _validate(events)
    assert "response.reasoning_summary_text.delta" in kinds and "response.reasoning_summary_part.done" in kinds
    final = Response.model_validate_json(msgspec.json.encode(out.response))
    rs = final.output[0]
    assert rs.type == "reasoning" and [s.text for s in rs.summary] == ["hmm"]
    assert not _stream().summary, "without `reasoning.summary`, no summary"
