"""The MCP server itself, on the official SDK's low-level `Server`: `tools/list` answers the table
of gateway/dialects/mcp/tools.py, `tools/call` decodes the arguments into the tool's struct and
runs it (gateway/dialects/mcp/calls.py).

What a call does wrong is a tool error (`isError: true`, its text naming the argument at fault),
as MCP asks, so that the model that called can read it and try again: arguments of the wrong
type, a missing or unknown argument, a model that is not installed or of the wrong kind, input
past a bound, a worker that refuses or fails. A tool that does not exist is a JSON-RPC error
(-32602), as the spec's own example has it. Nothing a call sends reaches the client as a crash:
an unexpected exception is logged with the request id and answered as a tool error that says so.

This module imports the SDK (about half a second), so gateway/dialects/mcp/routes.py imports it
on the first request to /mcp, not as the server starts.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import mcp_types as types
import msgspec
import structlog
from litestar.connection import ASGIConnection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from gateway.dialects.mcp import calls
from gateway.dialects.mcp.calls import Answer, Caller
from gateway.dialects.mcp.tools import BY_NAME, TOOLS, ToolSpec, schema_of
from gateway.errors import GenieXError
from gateway.http.auth import caller_of, tenant_of
from gateway.http.body import validation_error
from gateway.http.request_id import current_request_id
from gateway.http.services import Services

log = structlog.get_logger("gateway.mcp_server")

Run = Callable[[Services, Caller, Any], Awaitable[Answer]]
RUNS: dict[str, Run] = {"chat": calls.chat, "embed": calls.embed, "transcribe": calls.transcribe,
                        "speak": calls.speak, "list_models": calls.list_models}  # fmt: skip
OnCall = Callable[[str, str], None]  # (tool, outcome: ok, error, refused) -> the metrics
_MISSING = re.compile(r"^Object missing required field `([^`]+)`")
INSTRUCTIONS = ("GenieX runs AI models on this machine. `chat` asks a local language model, `embed` embeds texts, "
                "`transcribe` turns speech into text, `speak` turns text into speech (WAV), and `list_models` "
                "says which models are installed and which one each tool uses by default.")  # fmt: skip


def _version() -> str:
    try:
        return version("geniex-server")
    except PackageNotFoundError:
        return "0"


def argument_error(exc: msgspec.ValidationError, kind: type[msgspec.Struct]) -> str:
    """msgspec's refusal in the call's own terms: "`max_tokens`: Expected `int`, got `str`"."""
    detail = validation_error(exc, kind).extra[0]  # type: ignore[index]
    key, message = detail.get("key") or "", str(detail.get("message", ""))
    if m := _MISSING.match(message):
        return f"`{key + '.' if key else ''}{m.group(1)}`: a required argument is missing"
    return f"`{key}`: {message}" if key else message


def _failed(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def _result(answer: Answer) -> types.CallToolResult:
    content: list[types.ContentBlock] = []
    if answer.wav:
        content.append(types.AudioContent(data=calls.audio_b64(answer), mime_type="audio/wav"))
    content.append(types.TextContent(text=answer.text))
    return types.CallToolResult(content=content, structured_content=msgspec.to_builtins(answer.result))


def caller_from(ctx: ServerRequestContext[Any, Any]) -> Caller:
    """The caller of this HTTP request (its API key's label), from the ASGI scope the SDK hands on."""
    scope = getattr(ctx.request, "scope", None)
    if scope is None:  # not over HTTP (an in-process client)
        return Caller("")
    connection: ASGIConnection[Any, Any, Any, Any] = ASGIConnection(scope)
    return Caller(caller_of(connection), tenant_of(connection))


def listed(tool: ToolSpec) -> types.Tool:
    hints = types.ToolAnnotations(title=tool.title, read_only_hint=tool.read_only, destructive_hint=False,
                                  open_world_hint=False)  # fmt: skip
    return types.Tool(name=tool.name, title=tool.title, description=tool.description,
                      input_schema=schema_of(tool.args), output_schema=schema_of(tool.result),
                      annotations=hints)  # fmt: skip


def build(services: Services, on_call: OnCall) -> Server[Any]:
    tools = [listed(t) for t in TOOLS]

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:  # fmt: skip
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:  # fmt: skip
        tool = BY_NAME.get(params.name)
        if tool is None:
            on_call("unknown", "refused")
            raise MCPError(types.INVALID_PARAMS, f"`name`: unknown tool {params.name[:100]!r}; the tools are "
                           f"{', '.join(BY_NAME)}")  # fmt: skip
        structlog.contextvars.bind_contextvars(mcp_tool=tool.name)
        try:
            args = msgspec.convert(params.arguments or {}, tool.args)
            answer = await RUNS[tool.name](services, caller_from(ctx), args)
        except msgspec.ValidationError as exc:
            why = argument_error(exc, tool.args)
        except GenieXError as exc:
            why = exc.message
        except RecursionError:
            why = "the arguments nest too deeply"
        except Exception as exc:  # a tool call never takes the server (or its session) down
            log.exception("MCP tool call failed", tool=tool.name, error=repr(exc))
            why = f"internal error; the server log has the details under request id {current_request_id()}"
        else:
            on_call(tool.name, "ok")
            return _result(answer)
        log.info("MCP tool call refused", tool=tool.name, error=why)
        on_call(tool.name, "error")
        return _failed(why)

    return Server("geniex", version=_version(), title="GenieX", instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool)  # fmt: skip
