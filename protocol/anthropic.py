"""`/v1/messages`: the Anthropic Messages API's request, response, stream events and errors.

Only the wire shapes live here; `gateway/dialects/anthropic/translate.py` translates them to and from the
chat plan, so there is one decode path. Unknown fields are ignored (clients send `cache_control`,
`citations`, `service_tier` and more); known ones are validated, so a bad value is a 400 naming
the field. Blocks and choices are tagged by their `type`, as Anthropic spells them: an unknown
block type is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocol.limits import MAX_MESSAGES, MAX_REASONING_BUDGET, MAX_STOP, MAX_TOOLS, Count, PositiveInt, StopString
from protocol.overflow import Truncated, Truncation

# ---- content blocks (request and response) -----------------------------------


class TextBlock(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ImageBlock(msgspec.Struct, tag_field="type", tag="image"):
    source: dict[str, Any]


class DocumentBlock(msgspec.Struct, tag_field="type", tag="document"):
    source: dict[str, Any]


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolReferenceBlock(msgspec.Struct, tag_field="type", tag="tool_reference"):
    """A tool search's result: the named tool is loaded (here, every tool is offered from the start)."""

    tool_name: Annotated[str, Meta(max_length=128)]


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result", kw_only=True):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock | ToolReferenceBlock] | None = None
    is_error: bool = False


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking"):
    thinking: str
    # Anthropic signs its thinking so that it can be sent back; a local model's needs no signature,
    # but the SDKs expect the field, so it is always present (empty).
    signature: str = ""


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking"):
    data: str


InputBlock = (
    TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)
OutputBlock = ThinkingBlock | TextBlock | ToolUseBlock

# ---- the request -------------------------------------------------------------


class InputMessage(msgspec.Struct):
    # `system`: Claude Code (2.1.3xx) adds a system turn among the messages; read as `system` is.
    role: Literal["user", "assistant", "system"]
    content: str | list[InputBlock]


class ToolDef(msgspec.Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=128)]
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    # "custom" or absent; Anthropic's server tools (`bash_20250124`, `web_search_...`) carry another.
    type: Annotated[str, Meta(max_length=64)] | None = None
    # Shown to the model only once a tool search loads it, at Anthropic; offered from the start
    # here (no tool search runs here), so the model can call it.
    defer_loading: bool = False


class ToolChoiceAuto(msgspec.Struct, tag_field="type", tag="auto"):
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(msgspec.Struct, tag_field="type", tag="any"):
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(msgspec.Struct, tag_field="type", tag="tool", kw_only=True):
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(msgspec.Struct, tag_field="type", tag="none"):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingConfig(msgspec.Struct):
    type: Literal["enabled", "disabled", "adaptive"]
    # With "enabled": the most tokens the thinking section may take (docs/api.md#reasoning-budgets);
    # absent, or "adaptive": the server's --reasoning-budget. "disabled": none.
    budget_tokens: Annotated[int, Meta(ge=0, le=MAX_REASONING_BUDGET)] | None = None


class OutputFormat(msgspec.Struct, tag_field="type", tag="json_schema"):
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct):
    """Structured outputs: the answer follows `format`'s JSON schema. `effort` is accepted and not read."""

    format: OutputFormat | None = None
    effort: str | None = None


class Metadata(msgspec.Struct):
    user_id: Annotated[str, Meta(max_length=256)] | None = None


class MessagesInput(msgspec.Struct, kw_only=True):
    """What `/v1/messages` and `/v1/messages/count_tokens` share: the prompt as the model sees it."""

    model: str
    # The chat endpoint's bounds (protocol/limits.py), so that neither dialect can ask for more work.
    messages: Annotated[list[InputMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[ToolDef], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(MessagesInput, kw_only=True):
    max_tokens: PositiveInt  # required, as Anthropic's API requires it
    stop_sequences: Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    stream: bool = False
    # Sampling: SDKs that dropped these parameters still send them in `extra_body`.
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Count | None = None
    metadata: Metadata | None = None
    # GenieX extension, as on chat: `auto` drops the oldest turns of a conversation longer than the
    # context (protocol/overflow.py); absent: the server's --truncation.
    truncation: Truncation | None = None


class CountTokensRequest(MessagesInput, kw_only=True):
    pass


class TokenCount(msgspec.Struct):
    input_tokens: int


# ---- the response ------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Usage(msgspec.Struct):
    """Anthropic counts a reused prompt prefix apart: `input_tokens` are the prompt tokens that
    were computed, `cache_read_input_tokens` those whose KV was reused (their sum is the prompt)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    energy_j: float | msgspec.UnsetType = msgspec.UNSET  # GenieX: the answer's share of the machine's energy


class Message(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[OutputBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage
    truncated: Truncated | msgspec.UnsetType = msgspec.UNSET  # GenieX extension: what `truncation: auto` dropped


# ---- stream events -------------------------------------------------------------


class TextDelta(msgspec.Struct, tag_field="type", tag="text_delta"):
    text: str


class ThinkingDelta(msgspec.Struct, tag_field="type", tag="thinking_delta"):
    thinking: str


class InputJsonDelta(msgspec.Struct, tag_field="type", tag="input_json_delta"):
    partial_json: str


BlockDelta = TextDelta | ThinkingDelta | InputJsonDelta


class MessageStart(msgspec.Struct, tag_field="type", tag="message_start"):
    message: Message


class ContentBlockStart(msgspec.Struct, tag_field="type", tag="content_block_start"):
    index: int
    content_block: OutputBlock


class ContentBlockDelta(msgspec.Struct, tag_field="type", tag="content_block_delta"):
    index: int
    delta: BlockDelta


class ContentBlockStop(msgspec.Struct, tag_field="type", tag="content_block_stop"):
    index: int


class MessageDeltaBody(msgspec.Struct):
    stop_reason: StopReason | None
    stop_sequence: str | None = None


class MessageDeltaUsage(msgspec.Struct, omit_defaults=True):
    """The final counts; the SDKs take `output_tokens` and, when present, the input counts."""

    output_tokens: int
    input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    energy_j: float | None = None  # GenieX: the answer's share of the machine's energy, where the OS reports it


class MessageDelta(msgspec.Struct, tag_field="type", tag="message_delta"):
    delta: MessageDeltaBody
    usage: MessageDeltaUsage


class MessageStop(msgspec.Struct, tag_field="type", tag="message_stop"):
    pass


class Ping(msgspec.Struct, tag_field="type", tag="ping"):
    pass


# ---- errors --------------------------------------------------------------------

ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
]


class ErrorDetail(msgspec.Struct):
    type: ErrorType
    message: str


class ErrorResponse(msgspec.Struct, tag_field="type", tag="error", omit_defaults=True):
    """The body of every error on `/v1/messages` routes, and the `error` event of a broken stream."""

    error: ErrorDetail
    request_id: str | None = None


StreamEvent = (
    MessageStart | ContentBlockStart | ContentBlockDelta | ContentBlockStop | MessageDelta | MessageStop | Ping
    | ErrorResponse
)  # fmt: skip
