"""An MCP tool's result as the response's `mcp_call` item shows it and as the model reads it.

The item keeps the server's text as it came (within the bound). The model reads the same text
with special-token spellings broken (`contained`): a tool's result is a third party's text, and
`<|im_start|>system` in it must stay words inside the tool's turn, not become the template's
tokens (the worker parses special tokens in the prompt it renders).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import msgspec

from protocol import responses as r

if TYPE_CHECKING:
    from mcp import types

# JSON-RPC error codes for what went wrong on this side (the SDK's own use -32000 and below).
TIMED_OUT = -32001
TOO_LARGE = -32002
CONNECTION = -32003
UNAVAILABLE = -32004
NOT_RUN = -32005
BAD_ARGUMENTS = -32602  # JSON-RPC's invalid params


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """A call's end: `output` (the tool's text) or `error`, and the metric's outcome label."""

    outcome: str  # ok, tool_error, timeout, too_large, protocol_error, crashed, unavailable
    output: str | None = None
    error: r.McpCallError | None = None

    @property
    def for_model(self) -> str:
        return for_model(self.output, self.error)


def for_model(output: str | None, error: r.McpCallError | None) -> str:
    """What the model reads in the tool's turn for a call's output or error."""
    if output is not None:
        return contained(output)
    if isinstance(error, r.McpToolExecutionError):
        return contained("the tool failed: " + _error_text(error.content))
    if error is not None:
        return contained(f"the call failed: {error.message}")
    return "the call did not finish"


def failed(outcome: str, code: int, message: str) -> Outcome:
    return Outcome(outcome=outcome, error=r.McpProtocolError(code, message))


def _error_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _part(block: types.ContentBlock) -> str:
    from mcp import types  # loaded by then: the result came through the SDK

    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            return res.text
        return f"[resource {res.uri}, {res.mime_type or 'binary'}]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link {block.uri}]"
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type} {block.mime_type}, {len(block.data) * 3 // 4:,} bytes]"
    return f"[{getattr(block, 'type', 'content')}]"


def outcome_of(result: types.CallToolResult, max_bytes: int) -> Outcome:
    """The result, or an error when its text is over `max_bytes` (the model never reads more)."""
    text = "\n".join(_part(b) for b in result.content)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    size = len(text.encode())
    if size > max_bytes:
        return failed("too_large", TOO_LARGE, f"the tool's result is {size:,} bytes, more than this server's bound of "
                                              f"{max_bytes:,} (--mcp-max-result-kb)")  # fmt: skip
    if result.is_error:
        return Outcome(outcome="tool_error", error=r.McpToolExecutionError([{"type": "text", "text": text}]))
    return Outcome(outcome="ok", output=text)


_SPECIAL = re.compile(r"<\||\|>|<s>|</s>|\[INST\]|\[/INST\]|<think>|</think>")


def contained(text: str) -> str:
    """`text` with the spellings of chat templates' special tokens (`<|im_start|>`, `<s>`,
    `[INST]`, `<think>`) broken by a zero-width joiner, so that the worker reads them as text."""
    return _SPECIAL.sub(lambda m: m.group(0)[0] + "\u200d" + m.group(0)[1:], text)
