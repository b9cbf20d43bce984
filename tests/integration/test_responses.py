"""The OpenAI Responses API on the real server and model, driven by the official `openai` SDK
(create, the SDK's stream helper, JSON schema, a forced function call, previous_response_id,
retrieve and delete) and by the OpenAI Agents SDK running a one-tool agent. The streamed answer,
as the SDK accumulates it, equals the non-streamed one; every raw event and response validates
against the SDK's own pydantic types (which `create` itself only constructs, unchecked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from tests import codex_request
from tests.conftest import MODEL, WEATHER_PARAMETERS
from tests.server_proc import ServerProcess

HI = "Hi!"  # SmolLM2 answers it in 9 greedy tokens and stops: a completed response
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 32}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "parameters": WEATHER_PARAMETERS,
    "strict": True,
}
TIME = {"type": "function", "name": "get_time", "description": "Local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
FORCED: dict[str, Any] = {"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "name": "get_weather"}}

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


def raw_events(server: ServerProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE events of a streamed request, each checked: named after its type, and valid as the SDK's type."""
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data], "every event is named after its type"
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    for d in data:
        EVENTS.validate_python(d)
    return data


def created(server: ServerProcess, **body: Any) -> dict[str, Any]:
    """A non-streamed response as raw JSON, validated by the SDK's Response model."""
    r = httpx.post(f"{server.base_url}/v1/responses", json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())
    return dict(r.json())


def test_text_answers_like_chat_and_the_stream_adds_up_to_it(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, instructions="Be brief.", input=HI, **GREEDY)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status == "completed" and r.incomplete_details is None
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed" and r.output_text
    assert r.usage is not None and 0 < r.usage.output_tokens < 32
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert (r.temperature, r.instructions, r.max_output_tokens, r.store) == (0, "Be brief.", 32, True)
    # the same request through chat completions: one decode path, the same greedy text
    c = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=32, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": HI}])  # fmt: skip
    assert c.choices[0].message.content == r.output_text
    assert c.usage is not None and (c.usage.prompt_tokens, c.usage.completion_tokens) == (
        r.usage.input_tokens, r.usage.output_tokens)  # fmt: skip

    with client.responses.stream(model=MODEL, instructions="Be brief.", input=HI, **GREEDY) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert final.output_text == r.output_text and final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens == r.usage.output_tokens
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    assert set(kinds[4:-4]) == {"response.output_text.delta"}


def test_raw_events_and_responses_validate_as_the_sdks_types(server: ServerProcess) -> None:
    body = {"model": MODEL, "input": HI, **GREEDY}
    whole = created(server, **body)
    events = raw_events(server, body)
    done = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and done["id"] == events[0]["response"]["id"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == done["output"][0]["content"][0]["text"] == whole["output"][0]["content"][0]["text"]


def test_max_output_tokens_makes_an_incomplete_response(client: openai.OpenAI, server: ServerProcess) -> None:
    r = client.responses.create(model=MODEL, input="Tell me a long story.", temperature=0, max_output_tokens=4)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.usage is not None and r.usage.output_tokens == 4
    assert r.output[0].status == "incomplete"
    events = raw_events(server, {"model": MODEL, "input": "Tell me a long story.", "temperature": 0,
                                 "max_output_tokens": 4})  # fmt: skip
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == r.output_text


def test_text_format_json_schema_gives_json_matching_it(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}  # fmt: skip
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    r = client.responses.create(model=MODEL, input="What is the capital of France?", text=fmt,  # type: ignore[arg-type]
                                temperature=0, max_output_tokens=40)  # fmt: skip
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text is not None and r.text.format is not None and r.text.format.type == "json_schema"
    obj = client.responses.create(model=MODEL, input="A JSON object about Paris.", text={"format": {"type": "json_object"}},
                                  temperature=0, max_output_tokens=24)  # fmt: skip
    assert obj.output_text.startswith("{")  # an object, cut short by the token limit


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_function_call_has_arguments_matching_its_schema(client: openai.OpenAI, server: ServerProcess,
                                                                   stream: bool) -> None:  # fmt: skip
    kw: dict[str, Any] = {"input": "Weather in Paris?", **FORCED, "temperature": 0, "max_output_tokens": 60}
    r = client.responses.create(model=MODEL, **kw)
    assert r.status == "completed"
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert [t.name for t in r.tools if t.type == "function"] == ["get_weather", "get_time"]
    if stream:
        with client.responses.stream(model=MODEL, **kw) as s:
            events = list(s)
            final = s.get_final_response()
        (s_call,) = [o for o in final.output if o.type == "function_call"]
        assert (s_call.name, s_call.arguments, final.status) == (call.name, call.arguments, "completed")
        fragments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        assert len(fragments) > 1 and "".join(fragments) == call.arguments, "the arguments stream in fragments"
        raw = raw_events(server, {"model": MODEL, **kw})
        kinds = [e["type"] for e in raw if "function_call" in e["type"] or "item" in e["type"]]
        # how many fragments depends on timing (--stream-interval-ms batches tokens), their sum does not
        assert kinds[0] == "response.output_item.added" and kinds[-2:] == [
            "response.function_call_arguments.done", "response.output_item.done"]  # fmt: skip
        assert set(kinds[1:-2]) == {"response.function_call_arguments.delta"}
        assert (
            "".join(e["delta"] for e in raw if e["type"] == "response.function_call_arguments.delta") == call.arguments
        )


def test_previous_response_id_continues_the_conversation_and_reuses_its_prefix(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL, instructions="Be brief.", input="My name is Ada.", **GREEDY)
    assert first.usage is not None
    second = client.responses.create(model=MODEL, instructions="Be brief.", previous_response_id=first.id,
                                     input="What is my name?", **GREEDY)  # fmt: skip
    assert second.previous_response_id == first.id and second.usage is not None
    # the earlier turn is in the prompt, and its KV (prompt and answer) was reused
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    # stateless: the same conversation sent whole, with store off, is the same prompt
    history = [{"role": "user", "content": "My name is Ada."}, *[o.model_dump(exclude_none=True) for o in first.output],
               {"role": "user", "content": "What is my name?"}]  # fmt: skip
    whole = client.responses.create(model=MODEL, instructions="Be brief.", input=history, store=False, **GREEDY)
    assert whole.usage is not None and whole.usage.input_tokens == second.usage.input_tokens
    assert whole.output_text == second.output_text
    # a response made with store: false cannot be continued, retrieved or deleted
    with pytest.raises(openai.NotFoundError) as nf:
        client.responses.create(model=MODEL, previous_response_id=whole.id, input="And?", **GREEDY)
    assert whole.id in _error(nf.value) and "previous_response_id" in _error(nf.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(whole.id)


def test_a_stream_can_be_continued_and_retrieved_then_deleted(client: openai.OpenAI, server: ServerProcess) -> None:
    with client.responses.stream(model=MODEL, input=HI, **GREEDY) as s:
        final = s.get_final_response()
    got = client.responses.retrieve(final.id)
    assert got.id == final.id and got.output_text == final.output_text and got.status == "completed"
    Response.model_validate(httpx.get(f"{server.base_url}/v1/responses/{final.id}", timeout=10).json())
    after = client.responses.create(model=MODEL, previous_response_id=final.id, input="Thanks.", **GREEDY)
    assert after.usage is not None and after.usage.input_tokens_details.cached_tokens > 0
    r = httpx.delete(f"{server.base_url}/v1/responses/{final.id}", timeout=10)
    assert r.status_code == 200 and r.json() == {"id": final.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(final.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(final.id)
    client.responses.delete(after.id)  # the SDK's own call


def test_a_tool_round_trip_through_function_call_output(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="Weather in Paris?", **FORCED, temperature=0, max_output_tokens=60)
    (call,) = [o for o in r.output if o.type == "function_call"]
    after = client.responses.create(model=MODEL, previous_response_id=r.id, tools=[WEATHER], **GREEDY, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees, sunny"}])  # fmt: skip
    assert after.status in ("completed", "incomplete") and after.output_text


def test_reasoning_effort_is_accepted_and_echoed(client: openai.OpenAI) -> None:
    """SmolLM2 never thinks, so this proves the path (split on, effort read), not the items:
    tests/unit/test_responses_dialect.py shows reasoning becoming reasoning items and events."""
    kw: dict[str, Any] = {"input": HI, "reasoning": {"effort": "low"}, **GREEDY}
    r = client.responses.create(model=MODEL, **kw)
    assert r.reasoning is not None and r.reasoning.effort == "low"
    with client.responses.stream(model=MODEL, **kw) as s:
        final = s.get_final_response()
    assert final.output_text == r.output_text and [o.type for o in final.output] == [o.type for o in r.output]


def _error(exc: openai.APIStatusError) -> str:
    """The message of an error body in this server's shape, `{"error": "..."}`."""
    message = exc.response.json()["error"]
    assert isinstance(message, str)
    return message


def test_errors_name_the_field_and_keep_the_servers_shape(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nobody/nothing:Q4_0", input=HI)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
         "input[0].content[0]"),
        ({"input": HI, "tools": [WEATHER, {"type": "web_search"}], "tool_choice": {"type": "web_search"}},
         "tool_choice.type"),
        ({"input": HI, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"input": HI, "tool_choice": "required"}, "tool_choice"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
        ({"input": HI, "temperature": 3}, "temperature"),
        ({"input": HI, "max_output_tokens": "3"}, "max_output_tokens"),
        ({"input": HI, "text": {"format": {"type": "json_object"}}, **FORCED}, "text.format"),
        ({"input": "word " * 3000, "max_output_tokens": 4}, "context"),
    ]  # fmt: skip
    for body, named in cases:
        r = httpx.post(f"{server.base_url}/v1/responses", json={"model": MODEL, **body}, timeout=60)
        assert r.status_code == 400, (body, r.text)
        assert named in r.json()["error"], (named, r.json())
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=MODEL, input=HI, tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}],
                                tool_choice={"type": "file_search"})  # fmt: skip
    assert "'file_search', a tool this server does not run" in _error(bad.value)
    with pytest.raises(openai.NotFoundError) as nf:
        client.responses.retrieve("resp_nope")
    assert "resp_nope" in _error(nf.value)
    # a refused prompt is refused before a stream starts: a status, not a broken stream
    with pytest.raises(openai.BadRequestError):
        with client.responses.stream(model=MODEL, input="word " * 3000, max_output_tokens=4) as s:
            list(s)


def test_an_agent_runs_its_tool_through_the_responses_api(server: ServerProcess) -> None:
    import asyncio

    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # no exporter to reach here
    calls: list[tuple[int, int]] = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    async def run(streamed: bool) -> Any:
        http = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        agent = Agent(name="calculator", instructions="Add numbers with the add tool.", tools=[add],
                      model=OpenAIResponsesModel(model=MODEL, openai_client=http),
                      # a 135M model calls the tool reliably only when made to; the agent stops on its result
                      model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60),
                      tool_use_behavior="stop_on_first_tool")  # fmt: skip
        if not streamed:
            return (await Runner.run(agent, "What is 2 plus 3?")).final_output
        result = Runner.run_streamed(agent, "What is 2 plus 3?")
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(run(streamed=False)) == "5"
    assert asyncio.run(run(streamed=True)) == "5"
    assert calls == [(2, 3), (2, 3)]


def test_with_keys_each_key_sees_only_its_own_responses(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keys = tmp_path / "keys"
    keys.write_text("sk-alice-0123456789 alice\nsk-bob-0123456789 bob\n")
    srv = start("--nctx", "1024", "--api-key-file", str(keys))
    alice, bob = (openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=k, max_retries=0, timeout=120)
                  for k in ("sk-alice-0123456789", "sk-bob-0123456789"))  # fmt: skip
    r = alice.responses.create(model=MODEL, input=HI, temperature=0, max_output_tokens=4)
    assert alice.responses.retrieve(r.id).id == r.id
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model=MODEL, input="And?", previous_response_id=r.id, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(r.id)
    alice.responses.delete(r.id)


# ---- what agent CLIs send: Codex 0.171's request, namespaces, hosted tools ---------------------


def test_codex_0171s_request_is_answered_streamed_and_not(client: openai.OpenAI, server: ServerProcess) -> None:
    body = codex_request.request(MODEL)
    events = raw_events(server, {**body, "temperature": 0, "max_output_tokens": 24})
    done = events[-1]["response"]
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
    # the hosted web search was not offered, and the response's tools say which were
    offered = [(t["type"], t["name"]) for t in done["tools"]]
    assert ("namespace", "multi_agent_v1") in offered and all(kind != "web_search" for kind, _ in offered)
    assert len(offered) == 8 and done["store"] is False
    r = httpx.post(f"{server.base_url}/v1/responses", json={**body, "stream": False, "max_output_tokens": 24},
                   timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.headers["GenieX-Tools-Not-Offered"] == "web_search (tools[8])"
    Response.model_validate(r.json())
    # the SDK's stream helper, given the same fields, parses every event into its types
    kw = {k: v for k, v in body.items() if k not in ("stream", "client_metadata")}
    with client.responses.stream(**kw, extra_body={"client_metadata": body["client_metadata"]},
                                 temperature=0, max_output_tokens=24) as s:  # fmt: skip
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds[0] == "response.created" and final.status in ("completed", "incomplete")


NAMESPACED = {"tools": [WEATHER, {"type": "namespace", "name": "weather_v2", "description": "Forecasts.",
                                  "tools": [{**WEATHER, "name": "get_weather"}]}]}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_namespaced_call_comes_back_namespaced_and_continues(client: openai.OpenAI, stream: bool) -> None:
    kw: dict[str, Any] = {"input": "Weather in Paris?", **NAMESPACED, "temperature": 0, "max_output_tokens": 60,
                          "tool_choice": {"type": "function", "name": "weather_v2.get_weather"}}  # fmt: skip
    if stream:
        with client.responses.stream(model=MODEL, **kw) as s:
            events = list(s)
            r = s.get_final_response()
        added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
        assert [(i.name, i.namespace) for i in added] == [("get_weather", "weather_v2")]  # type: ignore[union-attr]
    else:
        r = client.responses.create(model=MODEL, **kw)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert (call.name, call.namespace) == ("get_weather", "weather_v2"), "the namespaced function, not the top one"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    # the client runs it and sends back the call and its output (stateless, as Codex does)
    history = [{"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "22 degrees, sunny"}]  # fmt: skip
    after = client.responses.create(model=MODEL, input=history, **NAMESPACED, store=False, **GREEDY)
    assert after.status in ("completed", "incomplete") and after.output_text
    assert after.usage is not None and after.usage.input_tokens > r.usage.input_tokens  # type: ignore[union-attr]


def test_hostile_tools_are_400s_naming_the_tool_and_nothing_breaks(server: ServerProcess) -> None:
    spawn = {"type": "function", "name": "spawn", "parameters": {"type": "object"}}
    cases: list[tuple[list[dict[str, Any]], str]] = [
        ([{"type": "namespace", "name": "n", "tools": [{**spawn, "name": f"f{i}"} for i in range(10_000)]}],
         "tools[0].tools"),
        ([{"type": "namespace", "name": "n", "tools": [{"type": "namespace", "name": "m", "tools": [spawn]}]}],
         "tools[0].tools[0].type"),
        ([{"type": "namespace", "name": "n\u0000x", "tools": [spawn]}], "tools[0].name"),
        ([{"type": "namespace", "name": "n", "tools": [spawn]}, {**spawn, "name": "n.spawn"}], "tools[1].name"),
        ([{"type": "h" * 100_000}], "tools[0].type"),
    ]  # fmt: skip
    for tools, named in cases:
        r = httpx.post(
            f"{server.base_url}/v1/responses", json={"model": MODEL, "input": HI, "tools": tools}, timeout=60
        )
        assert r.status_code == 400, (named, r.text[:300])
        assert named in r.json()["error"], (named, r.json())
    choices: list[tuple[Any, str]] = [
        ({"type": "allowed_tools", "tools": "everything"}, "tool_choice.tools"),
        ({"type": "allowed_tools", "mode": "sometimes", "tools": []}, "tool_choice.mode"),
        ({"type": "allowed_tools", "tools": [spawn] * 10_000}, "tool_choice.tools"),
        ({"type": "allowed_tools", "tools": [[[[]]]]}, "tool_choice.tools[0]"),
        ({"type": 2**70}, "tool_choice.type"),
        ({"type": "function", "name": {"deep": [1]}}, "tool_choice.name"),
        ({"type": "function", "name": "spawn\x00"}, "tool_choice.name"),
        ("sometimes", "tool_choice"),
    ]  # fmt: skip
    for choice, named in choices:
        body = {"model": MODEL, "input": HI, "tools": [spawn], "tool_choice": choice}
        r = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=60)
        assert r.status_code == 400 and named in r.json()["error"], (named, r.text[:300])
    # a client's earlier call with a hostile namespace is history the model reads: served, or a
    # 400 naming the context it overflows, never a 500
    for namespace, status in (("n\x00" * 20, 200), ("n\x00" * 5000, 400)):
        odd = {"type": "function_call", "call_id": "c1", "name": "spawn", "namespace": namespace, "arguments": "{}"}
        body = {"model": MODEL, "input": [{"role": "user", "content": "hi"}, odd,
                                          {"type": "function_call_output", "call_id": "c1", "output": "done"}],
                "tools": [spawn], "max_output_tokens": 4, "store": False}  # fmt: skip
        r = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=60)
        assert r.status_code == status, r.text[:300]
        assert status == 200 or "context" in r.json()["error"]
    # an unknown tool type is served without it, and named
    r = httpx.post(f"{server.base_url}/v1/responses", timeout=60, json={"model": MODEL, "input": HI,
                   "tools": [spawn, {"type": "holodeck_2031"}], "max_output_tokens": 4})  # fmt: skip
    assert r.status_code == 200 and r.headers["GenieX-Tools-Not-Offered"] == "holodeck_2031 (tools[1])"
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def test_a_thinking_budget_closes_the_reasoning_item(client: openai.OpenAI, thinking_model: str) -> None:
    """The GenieX extension `thinking_budget_tokens` on a model inside a thinking section
    (tests/thinking_model.py): its reasoning is the 8 tokens chat completions gives (same prompt,
    greedy), then the answer; `reasoning.effort: none` thinks not at all."""
    story = "Write a long story about a dragon who learns to bake bread."
    chat = client.chat.completions.create(model=thinking_model, messages=[{"role": "user", "content": story}],
                                          max_tokens=30, temperature=0,
                                          extra_body={"thinking_budget_tokens": 8, "reasoning_format": "deepseek"})  # fmt: skip
    assert chat.usage.completion_tokens_details.reasoning_tokens == 8  # type: ignore[union-attr]
    r = client.responses.create(model=thinking_model, input=story, temperature=0, max_output_tokens=30,
                                extra_body={"thinking_budget_tokens": 8})  # fmt: skip
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == chat.choices[0].message.reasoning_content  # type: ignore[union-attr, index, attr-defined]
    assert r.output_text == chat.choices[0].message.content
    none = client.responses.create(model=thinking_model, input=story, temperature=0, max_output_tokens=12,
                                   reasoning={"effort": "none"})  # fmt: skip
    assert [o.type for o in none.output] == ["message"] and none.output_text
