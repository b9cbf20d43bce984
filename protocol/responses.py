"""`/v1/responses`: the OpenAI Responses API's request, input items, response, stream events.

Only the wire shapes live here; `gateway/dialects/responses/translate.py` translates them to and from the chat
plan, so there is one decode path. Unknown fields are ignored (clients send `include`,
`service_tier`, `client_metadata` and more); known ones are validated, so a bad
value is a 400 naming the field. Items, parts and formats are tagged by their `type`, as OpenAI
spells them.

Input items are decoded in two steps: the request holds them as JSON objects, and
`gateway/dialects/responses/translate.py` converts each into `InputItem`. A message item may leave its `type`
out (OpenAI's "easy input message", which the Agents SDK sends), and a tagged union needs its tag.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocol.chat import Compute
from protocol.limits import MAX_MESSAGES, MAX_TOOLS, Count, KeepAlive, PositiveInt, ReasoningBudget
from protocol.overflow import Truncated, Truncation

# ---- input items ---------------------------------------------------------------


class InputText(msgspec.Struct, tag_field="type", tag="input_text"):
    text: str


class InputImage(msgspec.Struct, tag_field="type", tag="input_image", kw_only=True):
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class InputFile(msgspec.Struct, tag_field="type", tag="input_file", kw_only=True):
    file_id: str | None = None
    file_data: str | None = None
    filename: str | None = None


class OutputText(msgspec.Struct, tag_field="type", tag="output_text", kw_only=True):
    """An answer's text part, as a response carries it and as clients send earlier turns back."""

    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class Refusal(msgspec.Struct, tag_field="type", tag="refusal"):
    refusal: str


ContentPart = InputText | InputImage | InputFile | OutputText | Refusal

Role = Literal["user", "assistant", "system", "developer"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class MessageItem(msgspec.Struct, tag_field="type", tag="message", kw_only=True):
    role: Role
    content: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallItem(msgspec.Struct, tag_field="type", tag="function_call", kw_only=True):
    call_id: Annotated[str, Meta(min_length=1, max_length=256)]
    name: str
    arguments: str
    namespace: str | None = None  # the call of a function offered in a `namespace` tool
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(msgspec.Struct, tag_field="type", tag="function_call_output", kw_only=True):
    call_id: Annotated[str, Meta(min_length=1, max_length=256)]
    output: str | list[ContentPart]
    name: str | None = None  # the call's, as clients may repeat them: the call_id is what is read
    namespace: str | None = None
    id: str | None = None
    status: ItemStatus | None = None


class SummaryText(msgspec.Struct, tag_field="type", tag="summary_text"):
    text: str


class ReasoningText(msgspec.Struct, tag_field="type", tag="reasoning_text"):
    text: str


class ReasoningItem(msgspec.Struct, tag_field="type", tag="reasoning", kw_only=True):
    """The reasoning of an earlier turn; `encrypted_content` is OpenAI's, which no local model reads."""

    id: str | None = None
    summary: list[SummaryText] = msgspec.field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


class McpApprovalResponseItem(msgspec.Struct, tag_field="type", tag="mcp_approval_response", kw_only=True):
    """The client's answer to an `mcp_approval_request` of an earlier response."""

    approval_request_id: Annotated[str, Meta(min_length=1, max_length=256)]
    approve: bool
    reason: Annotated[str, Meta(max_length=4096)] | None = None
    id: str | None = None


# ---- the request -------------------------------------------------------------


# A name as OpenAI allows it for functions (and as this server spells a namespaced function to
# the model: `namespace.name`, so neither part may hold a dot).
ToolName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class NamespaceMember(msgspec.Struct, kw_only=True):
    """A tool inside a `namespace` tool: a function (`custom` ones are not offered, see docs/api.md)."""

    type: str
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class McpToolFilter(msgspec.Struct, kw_only=True):
    """Tools of an MCP server by name; `read_only`: those the server marks `readOnlyHint`."""

    tool_names: Annotated[list[Annotated[str, Meta(max_length=128)]], Meta(max_length=MAX_TOOLS)] | None = None
    read_only: bool | None = None


class McpApprovalFilter(msgspec.Struct, kw_only=True):
    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


McpApproval = Literal["always", "never"] | McpApprovalFilter


class McpFields(msgspec.Struct, kw_only=True):
    """An `mcp` tool's own fields (gateway/dialects/responses/mcp.py reads them): which configured
    server (`server_label`), which of its tools, which calls wait for the client's approval
    (OpenAI's default: all), and request headers where the operator lets requests set them. A
    `server_url`, `connector_id` or `authorization` that is not the operator's is refused."""

    server_label: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    server_url: Annotated[str, Meta(max_length=2048)] | None = None
    server_description: Annotated[str, Meta(max_length=4096)] | None = None
    connector_id: Annotated[str, Meta(max_length=256)] | None = None
    authorization: Annotated[str, Meta(max_length=8192)] | None = None
    allowed_tools: Annotated[list[Annotated[str, Meta(max_length=128)]], Meta(max_length=MAX_TOOLS)] | McpToolFilter | None = None  # fmt: skip
    require_approval: McpApproval | None = None
    headers: Annotated[dict[Annotated[str, Meta(max_length=128)], Annotated[str, Meta(max_length=8192)]], Meta(max_length=32)] | None = None  # fmt: skip


class RequestTool(McpFields, kw_only=True):
    """A tool as the Responses API spells it: a flat function tool `{type: "function", name,
    description, parameters, strict}`, a `namespace` of function tools `{type: "namespace", name,
    description, tools}`, or one of OpenAI's hosted tools (`web_search`, `file_search`, ...), which
    is not offered to the model (gateway/dialects/responses/translate.py). `type` is a plain string so that a
    hosted tool, known or not, reaches that rule rather than a decoding error; a hosted tool's own
    fields are not read, but for `mcp`'s (McpFields), which this server runs."""

    type: Annotated[str, Meta(max_length=64)]
    name: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    tools: Annotated[list[NamespaceMember], Meta(max_length=MAX_TOOLS)] | None = None  # a namespace's


# `tool_choice` is read in gateway/dialects/responses/translate.py: the modes, `{type: "function", name}`,
# `{type: "allowed_tools", mode, tools}`, and a hosted tool's `{type: ...}` (a 400 naming it).
ToolChoice = Literal["auto", "none", "required"] | dict[str, Any]


class FormatText(msgspec.Struct, tag_field="type", tag="text"):
    pass


class FormatJsonObject(msgspec.Struct, tag_field="type", tag="json_object"):
    pass


class FormatJsonSchema(msgspec.Struct, tag_field="type", tag="json_schema", kw_only=True, omit_defaults=True):
    name: Annotated[str, Meta(max_length=64)]
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


TextFormat = FormatText | FormatJsonObject | FormatJsonSchema


class TextConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    format: TextFormat = msgspec.field(default_factory=FormatText)
    verbosity: Literal["low", "medium", "high"] | None = None


Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class ReasoningConfig(msgspec.Struct, kw_only=True):
    """Accepted and echoed; `effort: none` tells the template not to think (see docs/api.md)."""

    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


MetadataValue = Annotated[str, Meta(max_length=512)]
Metadata = Annotated[dict[Annotated[str, Meta(max_length=64)], MetadataValue], Meta(max_length=16)]


class ConversationRef(msgspec.Struct):
    id: Annotated[str, Meta(max_length=256)]


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    # A string is one user message; a list holds items (messages, calls, call outputs, reasoning),
    # converted one by one (see the module's docstring). Bounded as chat bounds `messages`.
    input: str | Annotated[list[dict[str, Any]], Meta(max_length=MAX_MESSAGES)]
    instructions: str | None = None
    tools: Annotated[list[RequestTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: PositiveInt | None = None
    max_tool_calls: PositiveInt | None = None  # calls of MCP tools the server runs for this response
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: Annotated[str, Meta(max_length=256)] | None = None
    metadata: Metadata | None = None
    # The prompt-cache tenant within the caller's key (Codex sends its session's id): a cached
    # prefix is reused only by requests with the same key, as with `cache_salt`.
    prompt_cache_key: Annotated[str, Meta(max_length=256)] | None = None
    # GenieX extensions, as on chat completions
    nctx: Count | None = None  # 0 or absent: the server's --nctx, as on chat
    compute: Compute | None = None
    keep_alive: KeepAlive | None = None
    cache_salt: Annotated[str, Meta(max_length=256)] | None = None
    # `auto`: a conversation longer than the context loses its oldest items until it fits
    # (protocol/overflow.py); `disabled`: it is a 400. Absent: the server's --truncation.
    truncation: Truncation | None = None
    # GenieX extension, as chat's: the thinking section's budget in tokens (-1 unlimited, 0 none);
    # it wins over `reasoning.effort` (docs/api.md#reasoning-budgets).
    thinking_budget_tokens: ReasoningBudget | None = None
    # Run without the client: the answer is `queued` at once and kept (it needs `store`), polled
    # with GET, cancelled with POST .../cancel (gateway/dialects/responses/background.py).
    background: bool = False
    # A conversation (/v1/conversations) whose items come before `input`, and which gets this
    # response's input and output items appended: its id, or `{"id": ...}`.
    conversation: Annotated[str, Meta(max_length=256)] | ConversationRef | None = None


# ---- the response --------------------------------------------------------------


class OutputMessage(msgspec.Struct, tag_field="type", tag="message", kw_only=True):
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCall(msgspec.Struct, tag_field="type", tag="function_call", kw_only=True, omit_defaults=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus
    namespace: str | None = None  # set for a function of a `namespace` tool; `name` is then its own


class Reasoning(msgspec.Struct, tag_field="type", tag="reasoning", kw_only=True):
    """A model's own reasoning text goes in `content` (as gpt-oss's does); `summary` holds the same
    text when the request asks for a summary (`reasoning.summary`): nothing shortens it."""

    id: str
    summary: list[SummaryText] = msgspec.field(default_factory=list)
    content: list[ReasoningText] = msgspec.field(default_factory=list)
    status: ItemStatus


class McpListedTool(msgspec.Struct, kw_only=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    annotations: dict[str, Any] | None = None


class McpListTools(msgspec.Struct, tag_field="type", tag="mcp_list_tools", kw_only=True):
    """The tools of one MCP server offered to the model (after `allowed_tools`)."""

    id: str
    server_label: str
    tools: list[McpListedTool]
    error: str | None = None


class McpProtocolError(msgspec.Struct, tag_field="type", tag="mcp_protocol_error"):
    """The call did not get an answer: a time-out, a server that exited, a malformed message, a result over the bound."""

    code: int
    message: str


class McpToolExecutionError(msgspec.Struct, tag_field="type", tag="mcp_tool_execution_error"):
    """The tool ran and said it failed (`isError`); `content`: what it said."""

    content: Any


class McpHttpError(msgspec.Struct, tag_field="type", tag="http_error"):
    code: int
    message: str


McpCallError = McpProtocolError | McpToolExecutionError | McpHttpError


class McpCall(msgspec.Struct, tag_field="type", tag="mcp_call", kw_only=True):
    id: str
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: McpCallError | None = None
    status: Literal["in_progress", "calling", "completed", "incomplete", "failed"] | None = None
    approval_request_id: str | None = None


class McpApprovalRequest(msgspec.Struct, tag_field="type", tag="mcp_approval_request", kw_only=True):
    """A call the model made that runs only once the client approves it, in its next request."""

    id: str
    server_label: str
    name: str
    arguments: str


OutputItem = Reasoning | OutputMessage | FunctionCall | McpListTools | McpCall | McpApprovalRequest

# Input items: the MCP items of an earlier response come back as the output's classes (a call with
# its output, an approval request; a tool list, not read: the `mcp` tool in `tools` offers the tools).
InputItem = (
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem | McpApprovalResponseItem
    | McpListTools | McpCall | McpApprovalRequest
)  # fmt: skip

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class Usage(msgspec.Struct):
    """`input_tokens` is the whole prompt; `cached_tokens` the part whose KV was reused."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int
    energy_j: float | None = None  # GenieX: the answer's share of the machine's energy, where the OS reports it


class IncompleteDetails(msgspec.Struct):
    reason: Literal["max_output_tokens"]


class ResponseError(msgspec.Struct):
    code: Literal["server_error"]
    message: str


class Response(msgspec.Struct, kw_only=True):
    """The response object, with the request's settings echoed as the SDKs' types expect them."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: ReasoningConfig | None = None
    store: bool = True
    temperature: float | None = None
    text: TextConfig = msgspec.field(default_factory=TextConfig)
    tool_choice: ToolChoice = "auto"
    # The tools the model was offered (function and namespace tools), as the request spelled them:
    # a hosted tool this server does not run is left out here, as it was from the prompt.
    tools: list[dict[str, Any]] = msgspec.field(default_factory=list)
    top_p: float | None = None
    truncation: Truncation = "disabled"
    truncated: Truncated | msgspec.UnsetType = msgspec.UNSET  # GenieX extension: what `truncation: auto` dropped
    usage: Usage | None = None
    user: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    background: bool = False
    conversation: ConversationRef | None = None


class Deleted(msgspec.Struct):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


# ---- stream events -------------------------------------------------------------
# Each event carries `sequence_number`, its place in the stream (0, 1, 2, ...).


class Created(msgspec.Struct, tag_field="type", tag="response.created"):
    sequence_number: int
    response: Response


class InProgress(msgspec.Struct, tag_field="type", tag="response.in_progress"):
    sequence_number: int
    response: Response


class Completed(msgspec.Struct, tag_field="type", tag="response.completed"):
    sequence_number: int
    response: Response


class Incomplete(msgspec.Struct, tag_field="type", tag="response.incomplete"):
    sequence_number: int
    response: Response


class Failed(msgspec.Struct, tag_field="type", tag="response.failed"):
    sequence_number: int
    response: Response


class ItemAdded(msgspec.Struct, tag_field="type", tag="response.output_item.added"):
    sequence_number: int
    output_index: int
    item: OutputItem


class ItemDone(msgspec.Struct, tag_field="type", tag="response.output_item.done"):
    sequence_number: int
    output_index: int
    item: OutputItem


Part = OutputText | ReasoningText


class PartAdded(msgspec.Struct, tag_field="type", tag="response.content_part.added"):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: Part


class PartDone(msgspec.Struct, tag_field="type", tag="response.content_part.done"):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: Part


class TextDelta(msgspec.Struct, tag_field="type", tag="response.output_text.delta", kw_only=True):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class TextDone(msgspec.Struct, tag_field="type", tag="response.output_text.done", kw_only=True):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = msgspec.field(default_factory=list)


class ReasoningDelta(msgspec.Struct, tag_field="type", tag="response.reasoning_text.delta"):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningDone(msgspec.Struct, tag_field="type", tag="response.reasoning_text.done"):
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str


class SummaryPartAdded(msgspec.Struct, tag_field="type", tag="response.reasoning_summary_part.added"):
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryText


class SummaryDelta(msgspec.Struct, tag_field="type", tag="response.reasoning_summary_text.delta"):
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    delta: str


class SummaryDone(msgspec.Struct, tag_field="type", tag="response.reasoning_summary_text.done"):
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    text: str


class SummaryPartDone(msgspec.Struct, tag_field="type", tag="response.reasoning_summary_part.done"):
    sequence_number: int
    item_id: str
    output_index: int
    summary_index: int
    part: SummaryText


class ArgumentsDelta(msgspec.Struct, tag_field="type", tag="response.function_call_arguments.delta"):
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDone(msgspec.Struct, tag_field="type", tag="response.function_call_arguments.done"):
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


class _McpItemEvent(msgspec.Struct):
    """An MCP item's step in a stream: which item, where in the output."""

    sequence_number: int
    item_id: str
    output_index: int


class McpListToolsInProgress(_McpItemEvent, tag_field="type", tag="response.mcp_list_tools.in_progress"):
    pass


class McpListToolsCompleted(_McpItemEvent, tag_field="type", tag="response.mcp_list_tools.completed"):
    pass


class McpListToolsFailed(_McpItemEvent, tag_field="type", tag="response.mcp_list_tools.failed"):
    pass


class McpArgumentsDelta(msgspec.Struct, tag_field="type", tag="response.mcp_call_arguments.delta"):
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class McpArgumentsDone(msgspec.Struct, tag_field="type", tag="response.mcp_call_arguments.done"):
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str


class McpCallInProgress(_McpItemEvent, tag_field="type", tag="response.mcp_call.in_progress"):
    pass


class McpCallCompleted(_McpItemEvent, tag_field="type", tag="response.mcp_call.completed"):
    pass


class McpCallFailed(_McpItemEvent, tag_field="type", tag="response.mcp_call.failed"):
    pass


class ErrorEvent(msgspec.Struct, tag_field="type", tag="error", kw_only=True):
    sequence_number: int
    message: str
    code: str | None = None
    param: str | None = None


StreamEvent = (
    Created | InProgress | Completed | Incomplete | Failed | ItemAdded | ItemDone | PartAdded | PartDone | TextDelta
    | TextDone | ReasoningDelta | ReasoningDone | SummaryPartAdded | SummaryDelta | SummaryDone | SummaryPartDone
    | ArgumentsDelta | ArgumentsDone | McpListToolsInProgress | McpListToolsCompleted | McpListToolsFailed
    | McpArgumentsDelta | McpArgumentsDone | McpCallInProgress | McpCallCompleted | McpCallFailed | ErrorEvent
)  # fmt: skip
