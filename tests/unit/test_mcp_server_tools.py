"""`/mcp`'s tools without a server: their schemas as MCP requires them, and the SDK's own in-process
client against the real low-level server (gateway/dialects/mcp/server.py), for everything a call
is refused for before it reaches a model (the integration tests, tests/integration/test_mcp_server.py,
run the tools on the real server and its models)."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from gateway.dialects.mcp import calls
from gateway.dialects.mcp.routes import body_limit
from gateway.dialects.mcp.server import argument_error, build
from gateway.dialects.mcp.tools import TOOLS, schema_of
from gateway.errors import BadRequest
from gateway.http.services import Services
from protocol import mcp_server as p

# Every call below is refused before a tool touches its Services: none is needed.
NO_SERVICES = cast(Services, object())


def test_every_schema_has_the_object_at_its_root_and_resolves_its_refs() -> None:
    for tool in TOOLS:
        for struct in (tool.args, tool.result):
            schema = schema_of(struct)
            assert schema["type"] == "object" and "$ref" not in schema, (tool.name, schema)
            refs = set(_refs(schema))
            assert refs <= {f"#/$defs/{name}" for name in schema.get("$defs", {})}, (tool.name, refs)
        assert schema_of(tool.args)["additionalProperties"] is False, tool.name  # unknown arguments are refused


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_optional_arguments_are_plain_types_a_model_fills_in() -> None:
    props = schema_of(p.ChatArgs)["properties"]
    assert props["max_tokens"] == {"description": props["max_tokens"]["description"], "type": "integer",
                                   "minimum": 1, "maximum": 2**31 - 1}  # fmt: skip
    assert schema_of(p.ChatArgs)["required"] == [] and schema_of(p.SpeakArgs)["required"] == ["text"]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"max_tokens": "many"}, "`max_tokens`: Expected `int`, got `str`"),
        ({"messages": [{"role": "user"}]}, "`messages[0].content`: a required argument is missing"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "`messages[0].role`"),
        ({"nctx": 9}, "Object contains unknown field `nctx`"),
    ],
)
def test_argument_errors_name_the_argument(args: dict[str, Any], why: str) -> None:
    with pytest.raises(msgspec.ValidationError) as exc:
        msgspec.convert(args, p.ChatArgs)
    assert why in argument_error(exc.value, p.ChatArgs)


def test_a_conversation_is_the_system_prompt_then_the_prompt_or_the_messages() -> None:
    turns = calls.conversation(p.ChatArgs(prompt="hi", system="be brief"))
    assert [(m.role, m.content) for m in turns] == [("system", "be brief"), ("user", "hi")]
    given = [p.Message("user", "a"), p.Message("assistant", "b"), p.Message("user", "c")]
    assert [m.content for m in calls.conversation(p.ChatArgs(messages=given))] == ["a", "b", "c"]
    for refused in (p.ChatArgs(), p.ChatArgs(prompt=" "), p.ChatArgs(messages=[]),
                    p.ChatArgs(prompt="a", messages=given)):  # fmt: skip
        with pytest.raises(BadRequest):
            calls.conversation(refused)


def test_a_body_holds_max_body_mb_of_audio_as_base64() -> None:
    assert body_limit(1) >= len(msgspec.json.encode({"audio": "A" * (4 * (1 << 20) // 3)}))
    assert body_limit(1) < 2 << 20


async def test_the_sdk_client_lists_the_tools_and_gets_tool_errors_for_bad_arguments() -> None:
    seen: list[tuple[str, str]] = []
    async with Client(build(NO_SERVICES, lambda tool, outcome: seen.append((tool, outcome))), cache=None) as client:
        listed = (await client.list_tools()).tools
        assert [t.name for t in listed] == [t.name for t in TOOLS]
        assert all(t.output_schema is not None and t.annotations is not None for t in listed)
        refused = await client.call_tool("chat", {"prompt": "hi", "max_tokens": -1})
        assert refused.is_error and "`max_tokens`" in refused.content[0].text  # type: ignore[union-attr]
        empty = await client.call_tool("chat", {})
        assert empty.is_error and "`prompt` or `messages` is required" in empty.content[0].text  # type: ignore[union-attr]
        with pytest.raises(MCPError, match="unknown tool"):
            await client.call_tool("format_disk", {})
    assert seen == [("chat", "error"), ("chat", "error"), ("unknown", "refused")]
