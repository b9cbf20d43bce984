"""The Responses request's `tools` and `tool_choice`, as the functions the model is offered.

- A `function` tool is offered as it is.
- A `namespace` tool's functions are offered as `namespace.name` (OpenAI's own models see them
  so), a name no top-level function can take without a 400 (`_Offer.declare`); a call of one
  goes back to the client as `{name, namespace}` (gateway/dialects/responses/events.py), and a
  client's `function_call` item with a `namespace` is read back the same way.
- An `mcp` tool's server tools (gateway/dialects/responses/mcp.py, listed by gateway/mcp/hub.py) are
  offered as `server_label.tool`, as a namespace's are; a call of one is the server's to run
  (`Toolset.mcp`), an `mcp_call` item, never a `function_call` for the client.
- Any other tool type is one this server cannot run: OpenAI's hosted tools (`web_search`,
  `file_search`, `code_interpreter`, `image_generation`, `tool_search`, ...) and the
  tools whose calls have item shapes of their own (`custom`, `computer_use_preview`, `shell`,
  `local_shell`, `apply_patch`). It is not offered: the request is served with the rest, the
  response's `tools` leaves it out, the log and the `GenieX-Tools-Not-Offered` header name it.
  Agent CLIs add such tools to every request (Codex sends `web_search`), so refusing them would
  refuse the client; but a `tool_choice` that forces one cannot be answered, and is a 400.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import structlog

from gateway.chat.convert import tool_schema
from gateway.dialects.responses.mcp import McpUse, echo, needs_approval, offered
from gateway.errors import BadRequest
from gateway.mcp.hub import McpTool
from protocol import chat
from protocol import responses as r
from protocol.limits import MAX_TOOLS

log = structlog.get_logger("gateway.tools")

_NAMESPACE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MODES = ("auto", "none", "required")


class McpTarget(msgspec.Struct, frozen=True, kw_only=True):
    """What the model's call of an MCP tool runs."""

    label: str
    name: str
    approval: bool  # waits for the client's `mcp_approval_response`
    headers: dict[str, str] | None = None


class Toolset(msgspec.Struct, kw_only=True):
    """The request's tools as this server uses them."""

    chat: list[chat.Tool] | None = None  # what the model is offered, by the names it sees
    namespaced: dict[str, tuple[str, str]] = msgspec.field(default_factory=dict)  # seen name -> (namespace, name)
    echo: list[dict[str, Any]] = msgspec.field(default_factory=list)  # the response's `tools`
    not_offered: list[str] = msgspec.field(default_factory=list)  # "web_search (tools[9])"
    not_offered_types: set[str] = msgspec.field(default_factory=set)
    mcp: dict[str, McpTarget] = msgspec.field(default_factory=dict)  # seen name -> the MCP tool it runs
    mcp_listed: list[tuple[str, list[McpTool]]] = msgspec.field(default_factory=list)  # (label, tools offered)

    def split(self, seen: str) -> tuple[str | None, str]:
        """A call's (namespace, name) from the name the model wrote."""
        return self.namespaced.get(seen, (None, seen))


def seen_name(name: str, namespace: str | None) -> str:
    """The name the model sees for a function (and wrote in an earlier turn's call)."""
    return f"{namespace}.{name}" if namespace else name


def _function(where: str, name: str, description: str | None, parameters: dict[str, Any] | None,
              strict: bool | None) -> chat.Tool:  # fmt: skip
    schema = None if parameters is None else tool_schema(parameters, f"{where}.parameters")
    return chat.Tool(function=chat.FunctionDef(name=name, description=description, parameters=schema, strict=strict))


def _echo(type_: str, name: str, description: str | None, parameters: dict[str, Any] | None,
          strict: bool | None) -> dict[str, Any]:  # fmt: skip
    return {"type": type_, "name": name, "description": description, "parameters": parameters, "strict": strict}


class _Offer:
    def __init__(self) -> None:
        self.set = Toolset()
        self.tools: list[chat.Tool] = []
        self.where: dict[str, str] = {}  # seen name -> where the request declared it

    def declare(self, seen: str, where: str) -> None:
        if seen in self.where:
            raise BadRequest(f"`{where}.name`: {seen[:160]!r} is also the name of `{self.where[seen]}`; each function "
                             "needs its own name (a namespace's function is offered as `namespace.name`)")  # fmt: skip
        self.where[seen] = where

    def skip(self, type_: str, where: str) -> None:
        self.set.not_offered.append(f"{type_[:64]} ({where})")
        self.set.not_offered_types.add(type_)

    def function(self, i: int, t: r.RequestTool) -> None:
        where = f"tools[{i}]"
        if t.name is None:
            raise BadRequest(f"`{where}.name`: a required field is missing")
        self.declare(t.name, where)
        self.tools.append(_function(where, t.name, t.description, t.parameters, t.strict))
        self.set.echo.append(_echo("function", t.name, t.description, t.parameters, t.strict))

    def namespace(self, i: int, t: r.RequestTool) -> None:
        where = f"tools[{i}]"
        if t.name is None or not _NAMESPACE_NAME.fullmatch(t.name):
            raise BadRequest(f"`{where}.name`: a namespace is named with 1 to 64 letters, digits, `_` or `-`")
        if not t.tools:
            raise BadRequest(f"`{where}.tools`: a namespace holds at least one function tool")
        members: list[dict[str, Any]] = []
        for j, m in enumerate(t.tools):
            at = f"{where}.tools[{j}]"
            if m.type == "namespace":
                raise BadRequest(f"`{at}.type`: a namespace holds function tools, not another namespace")
            if m.type != "function":
                self.skip(m.type, at)
                continue
            seen = seen_name(m.name, t.name)
            self.declare(seen, at)
            self.set.namespaced[seen] = (t.name, m.name)
            # The namespace's description is the model's only hint of what its functions are for.
            about = " ".join(d for d in (f"({t.description})" if t.description else "", m.description or "") if d)
            self.tools.append(_function(at, seen, about or None, m.parameters, m.strict))
            members.append(_echo("function", m.name, m.description, m.parameters, m.strict))
        self.set.echo.append({"type": "namespace", "name": t.name, "description": t.description or "",
                              "tools": members})  # fmt: skip

    def mcp(self, use: McpUse, listed: list[McpTool]) -> None:
        tools: list[McpTool] = []
        for tool in offered(use, listed):
            seen = seen_name(tool.name, use.label)
            about = " ".join(d for d in (f"(MCP server {use.label})", tool.description or "") if d)
            try:
                function = _function(use.where, seen, about, tool.input_schema, None)
            except BadRequest as exc:  # the server's schema, not the request's: that tool alone is left out
                log.warning("MCP tool not offered: its input schema is refused", server=use.label, tool=tool.name,
                            error=exc.message)  # fmt: skip
                continue
            self.declare(seen, use.where)
            self.set.mcp[seen] = McpTarget(label=use.label, name=tool.name, approval=needs_approval(use, tool),
                                           headers=use.headers)  # fmt: skip
            self.tools.append(function)
            tools.append(tool)
        self.set.mcp_listed.append((use.label, tools))
        self.set.echo.append(echo(use))


def toolset(tools: list[r.RequestTool] | None,
            mcp: dict[str, tuple[McpUse, list[McpTool]]] | None = None) -> Toolset:  # fmt: skip
    """`mcp`: by `tools[i]`, each `mcp` tool's use and its server's listed tools."""
    offer = _Offer()
    mcp = mcp or {}
    for i, t in enumerate(tools or []):
        if t.type == "function":
            offer.function(i, t)
        elif t.type == "namespace":
            offer.namespace(i, t)
        elif f"tools[{i}]" in mcp:
            offer.mcp(*mcp[f"tools[{i}]"])
        else:
            offer.skip(t.type, f"tools[{i}]")
    if len(offer.tools) > MAX_TOOLS:
        raise BadRequest(f"`tools`: {len(offer.tools)} functions in all, a namespace's counted one by one; "
                         f"at most {MAX_TOOLS}")  # fmt: skip
    offer.set.chat = offer.tools or None
    return offer.set


def _forced_name(choice: dict[str, Any], tools: Toolset) -> str:
    """The name the model sees for `{type: "function", name[, namespace]}`: a top-level function,
    `namespace.name`, or a namespace's function by its own name where only one has it."""
    name, namespace = choice.get("name"), choice.get("namespace")
    if not isinstance(name, str) or not (namespace is None or isinstance(namespace, str)):
        raise BadRequest("`tool_choice.name`: a function's name (a string) is required")
    offered = {t.function.name for t in tools.chat or []}
    seen = seen_name(name, namespace)
    if seen in offered:
        return seen
    matches = [s for s, (_, own) in tools.namespaced.items() if own == name and namespace is None]
    if len(matches) == 1:
        return matches[0]
    raise BadRequest(f"`tool_choice.name`: no function named {seen[:160]!r} in `tools`"
                     + (f" (it is in {len(matches)} namespaces: name one)" if matches else ""))  # fmt: skip


def _allowed(choice: dict[str, Any], tools: Toolset) -> str:
    """`{type: "allowed_tools", mode, tools}`: the offer narrowed to the listed functions (and the
    functions of listed namespaces); their mode, `auto` or `required`."""
    mode, listed = choice.get("mode", "auto"), choice.get("tools")
    if mode not in ("auto", "required"):
        raise BadRequest("`tool_choice.mode`: expected auto or required")
    if not isinstance(listed, list) or len(listed) > MAX_TOOLS:
        raise BadRequest(f"`tool_choice.tools`: a list of at most {MAX_TOOLS} tools is required")
    keep: set[str] = set()
    for k, entry in enumerate(listed):
        kind = entry.get("type") if isinstance(entry, dict) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        if kind == "function" and isinstance(name, str):
            keep.add(name)
        elif kind == "namespace" and isinstance(name, str):
            keep.update(s for s, (ns, _) in tools.namespaced.items() if ns == name)
        elif kind == "mcp" and isinstance(label := entry.get("server_label"), str):
            keep.update(s for s, t in tools.mcp.items() if t.label == label)
        elif not (isinstance(kind, str) and kind in tools.not_offered_types):
            raise BadRequest(f"`tool_choice.tools[{k}]`: expected a function or namespace tool of `tools` by its name")
    tools.chat = [t for t in tools.chat or [] if t.function.name in keep] or None
    if tools.chat is None and mode == "required":
        raise BadRequest("`tool_choice`: `required`, and none of its tools is a function this server offers")
    return mode


def _mcp_choice(choice: dict[str, Any], tools: Toolset) -> str | dict[str, Any]:
    """`{type: "mcp", server_label[, name]}`: that tool called, or one of that server's tools."""
    label, name = choice.get("server_label"), choice.get("name")
    if not isinstance(label, str) or not any(t.label == label for t in tools.mcp.values()):
        raise BadRequest("`tool_choice.server_label`: the label of an `mcp` tool in `tools` that offers a tool")
    if name is not None:
        seen = seen_name(str(name), label)
        if seen not in tools.mcp:
            raise BadRequest(f"`tool_choice.name`: MCP server {label!r} offers no tool {str(name)[:128]!r} here")
        return {"type": "function", "function": {"name": seen}}
    tools.chat = [t for t in tools.chat or [] if t.function.name in tools.mcp
                  and tools.mcp[t.function.name].label == label]  # fmt: skip
    return "required"


def tool_choice(choice: r.ToolChoice | None, tools: Toolset) -> str | dict[str, Any] | None:
    """The chat's `tool_choice` (narrowing `tools.chat` for `allowed_tools`)."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in _MODES:
            raise BadRequest(f"`tool_choice`: expected one of {', '.join(_MODES)} or an object")
        mode: str = choice
    else:
        kind = choice.get("type")
        if kind == "function":
            if not tools.chat:
                raise BadRequest("`tool_choice`: a named function needs `tools`")
            return {"type": "function", "function": {"name": _forced_name(choice, tools)}}
        if kind == "mcp":
            return _mcp_choice(choice, tools)
        if kind == "allowed_tools":
            mode = _allowed(choice, tools)
        elif isinstance(kind, str):
            raise BadRequest(f"`tool_choice.type`: forces {kind[:64]!r}, a tool this server does not run (it offers "
                             "the model function tools only)")  # fmt: skip
        else:
            raise BadRequest("`tool_choice.type`: a required field is missing")
    if not tools.chat:
        if mode == "required":
            raise BadRequest("`tool_choice`: `required` needs a function tool in `tools`"
                             + (f" ({', '.join(tools.not_offered)} not offered)" if tools.not_offered else ""))  # fmt: skip
        return None  # auto or none, with nothing to choose from: plain text either way
    return mode
