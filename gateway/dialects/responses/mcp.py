"""The Responses request's `mcp` tools: which configured server each names, which of its tools the
model is offered, which calls wait for the client's approval, and the approvals a request brings.

Everything here is checked before a server is contacted or a model loads: a `server_label` the
operator did not configure is a 400, one the caller's API key was not given a 403 naming it; a
`server_url` is refused unless it is the configured URL of that same server (a request can never
point the gateway at an address, a file or a command of its own); `headers` only where the
server's `requestHeaders` names them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.errors import BadRequest, Forbidden
from gateway.mcp.config import LABEL, ServerConfig, same_url
from gateway.mcp.hub import McpTool
from protocol import chat
from protocol import responses as r


class McpUse(msgspec.Struct, frozen=True, kw_only=True):
    """One `mcp` tool of the request, checked."""

    where: str  # tools[i]
    label: str
    tool: r.RequestTool
    headers: dict[str, str] | None = None


def _headers(where: str, t: r.RequestTool, config: ServerConfig) -> dict[str, str] | None:
    headers = dict(t.headers or {})
    if t.authorization is not None:
        headers["Authorization"] = f"Bearer {t.authorization}"
    if not headers:
        return None
    if config.transport == "stdio":
        raise BadRequest(f"`{where}.headers`: MCP server {config.label} runs over stdio; it takes no headers")
    for name, value in headers.items():
        if name.lower() not in config.request_headers:
            field = (
                "authorization" if name == "Authorization" and t.authorization is not None else f"headers.{name[:64]}"
            )
            allowed = ", ".join(sorted(config.request_headers)) or "none"
            raise BadRequest(f"`{where}.{field}`: the operator lets requests set only these headers for MCP server "
                             f"{config.label}: {allowed} (`requestHeaders` in --mcp-config)")  # fmt: skip
        if any(c in value for c in "\r\n\0"):
            raise BadRequest(f"`{where}.headers.{name[:64]}`: a header value holds no line breaks or NUL")
    return headers


def mcp_uses(tools: list[r.RequestTool] | None, configs: dict[str, ServerConfig], may_use: frozenset[str] | None,
             caller: str) -> list[McpUse]:  # fmt: skip
    """The request's `mcp` tools; `may_use`: the servers the caller's key may use (None: all)."""
    uses: list[McpUse] = []
    for i, t in enumerate(tools or []):
        if t.type != "mcp":
            continue
        where = f"tools[{i}]"
        label = t.server_label
        if label is None or not LABEL.fullmatch(label):
            raise BadRequest(f"`{where}.server_label`: the name of an MCP server this server's operator configured "
                             "(1 to 64 letters, digits, `_` or `-`)")  # fmt: skip
        if label not in configs:
            known = ", ".join(sorted(configs)) or "none (--mcp-config)"
            raise BadRequest(f"`{where}.server_label`: no MCP server {label!r} is configured here; configured: {known}")
        if may_use is not None and label not in may_use:
            raise Forbidden(f"this API key ({caller}) may not use MCP server {label!r}; the key file gives a key its "
                            "servers with `mcp=NAME,...`")  # fmt: skip
        config = configs[label]
        if t.connector_id is not None:
            raise BadRequest(f"`{where}.connector_id`: OpenAI's connectors are not served here; name a configured "
                             "server by `server_label`")  # fmt: skip
        if t.server_url is not None and not (config.url and same_url(config.url, t.server_url)):
            raise BadRequest(f"`{where}.server_url`: a request cannot choose where an MCP server is; leave it out "
                             f"(server {label!r} is where the operator configured it)")  # fmt: skip
        if any(u.label == label for u in uses):
            raise BadRequest(f"`{where}.server_label`: MCP server {label!r} is already in `tools`")
        uses.append(McpUse(where=where, label=label, tool=t, headers=_headers(where, t, config)))
    return uses


def _matches(f: r.McpToolFilter | None, tool: McpTool) -> bool:
    if f is None:
        return False
    named = f.tool_names is not None and tool.name in f.tool_names
    return named or (f.read_only is True and tool.read_only)


def offered(use: McpUse, tools: list[McpTool]) -> list[McpTool]:
    """The server's tools after the request's `allowed_tools`."""
    allowed = use.tool.allowed_tools
    if allowed is None:
        return tools
    if isinstance(allowed, list):
        names = set(allowed)
        return [t for t in tools if t.name in names]
    if allowed.tool_names is None and allowed.read_only is None:
        return tools
    return [t for t in tools if (allowed.tool_names is None or t.name in allowed.tool_names)
            and (not allowed.read_only or t.read_only)]  # fmt: skip


def needs_approval(use: McpUse, tool: McpTool) -> bool:
    """OpenAI's rule: every call waits for approval unless `require_approval` says `never` for it."""
    policy = use.tool.require_approval
    if policy is None or policy == "always":
        return True
    if policy == "never":
        return False
    if _matches(policy.never, tool):
        return False
    return True


def echo(use: McpUse) -> dict[str, Any]:
    """The tool as the response's `tools` shows it: never its headers or authorization."""
    t = use.tool
    out: dict[str, Any] = {"type": "mcp", "server_label": use.label}
    if t.server_url is not None:
        out["server_url"] = t.server_url
    if t.server_description is not None:
        out["server_description"] = t.server_description
    if t.allowed_tools is not None:
        out["allowed_tools"] = msgspec.to_builtins(t.allowed_tools)
    out["require_approval"] = msgspec.to_builtins(t.require_approval) if t.require_approval is not None else "always"
    return out


def listed_item(item_id: str, label: str, tools: list[McpTool]) -> r.McpListTools:
    return r.McpListTools(id=item_id, server_label=label, tools=[
        r.McpListedTool(name=t.name, input_schema=t.input_schema, description=t.description,
                        annotations=t.annotations) for t in tools])  # fmt: skip


def pending_approvals(conversation: list[chat.ChatMessage]) -> dict[str, chat.ToolCall]:
    """The approval requests of the conversation that no tool turn has answered yet, by id."""
    answered = {m.tool_call_id for m in conversation if m.role == "tool"}
    return {c.id: c for m in conversation if m.role == "assistant" for c in m.tool_calls or []
            if c.id.startswith(APPROVAL_PREFIX) and c.id not in answered}  # fmt: skip


APPROVAL_PREFIX = "mcpr_"


def with_result(conversation: list[chat.ChatMessage], call_id: str, text: str) -> list[chat.ChatMessage]:
    """`conversation` with the tool turn answering `call_id` right after the turns that answer the
    same assistant message's other calls (the template reads a call's results after the call)."""
    out = list(conversation)
    for i, m in enumerate(out):
        if m.role == "assistant" and any(c.id == call_id for c in m.tool_calls or []):
            j = i + 1
            while j < len(out) and out[j].role == "tool":
                j += 1
            out.insert(j, chat.ChatMessage(role="tool", content=text, tool_call_id=call_id))
            return out
    return [*out, chat.ChatMessage(role="tool", content=text, tool_call_id=call_id)]
