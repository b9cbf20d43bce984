"""The OpenAI Responses dialect, translated at the edge: a `/v1/responses` request becomes the
same ChatRequest (so the same ChatPlan and the same decode path) as `/v1/chat/completions`; the
answer's pieces become output items (gateway/dialects/responses/events.py).

Every refusal names the Responses field (`input[2].content[0]`), not the chat field it maps to.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from gateway.chat.constraints import bounded_schema
from gateway.dialects.responses.mcp import McpUse
from gateway.dialects.responses.tools import Toolset, seen_name, tool_choice, toolset
from gateway.errors import BadRequest
from gateway.mcp.hub import McpTool
from gateway.mcp.results import for_model
from protocol import chat
from protocol import responses as r
from protocol.overflow import Truncation

_NOT_READ = "{kind} parts are not read here (images are read as `input_image` parts of a user message)"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


# ---- input items -----------------------------------------------------------------


def input_items(raw: str | list[dict[str, Any]]) -> list[r.InputItem]:
    """The request's `input` as typed items: a string is one user message; a message item may
    leave `type` out (OpenAI's easy input message)."""
    if isinstance(raw, str):
        return [r.MessageItem(role="user", content=raw)]
    items: list[r.InputItem] = []
    for i, obj in enumerate(raw):
        if "type" not in obj and "role" in obj:
            obj = {**obj, "type": "message"}
        try:
            items.append(msgspec.convert(obj, r.InputItem))
        except msgspec.ValidationError as exc:
            # msgspec ends its message with the path inside the item: "... - at `$.content[0].text`".
            message, _, at = str(exc).partition(" - at `$")
            path = at.rstrip("`")
            if path == ".type" and message.startswith("Invalid value"):
                message += (
                    "; this server reads message, function_call, function_call_output, reasoning, "
                    "mcp_call, mcp_approval_request, mcp_approval_response and mcp_list_tools items"
                )
            raise BadRequest(f"`input[{i}]{path}`: {message}") from None
    return items


def _text_of(where: str, content: str | list[r.ContentPart]) -> str:
    """A message's or a call output's text; adjacent parts are one turn's paragraphs."""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, r.InputText | r.OutputText):
            texts.append(part.text)
        elif isinstance(part, r.Refusal):
            texts.append(part.refusal)
        else:
            kind = part.__struct_config__.tag
            raise BadRequest(f"`{where}[{j}]`: " + _NOT_READ.format(kind=kind))
    return "\n".join(texts)


def _user_content(where: str, content: str | list[r.ContentPart]) -> str | list[chat.ContentPart]:
    """A user message's text, or with `input_image` parts its text and images in their order (as
    chat's `image_url` parts, read by the gateway as for chat completions)."""
    if isinstance(content, str) or not any(isinstance(p, r.InputImage) for p in content):
        return _text_of(where, content)
    out: list[chat.ContentPart] = []
    for j, part in enumerate(content):
        if isinstance(part, r.InputImage):
            if not part.image_url:
                raise BadRequest(f"`{where}[{j}].image_url`: an image is sent by URL here (a data: URL); "
                                 "this server keeps no files")  # fmt: skip
            detail = part.detail if part.detail in ("low", "high", "auto") else None
            out.append(chat.ContentPart(type="image_url", image_url=chat.ImageURL(url=part.image_url, detail=detail)))  # type: ignore[arg-type]
        else:
            out.append(chat.ContentPart(type="text", text=_text_of(where, [part])))
    return out


def image_fields(req: r.ResponsesRequest) -> list[str]:
    """Where each image of the request's own input is (the names its errors give)."""
    if isinstance(req.input, str):
        return []
    return [f"input[{i}].content[{j}]" for i, item in enumerate(req.input) if isinstance(item, dict)
            and item.get("role") == "user" and isinstance(item.get("content"), list)
            for j, part in enumerate(item["content"]) if isinstance(part, dict) and part.get("type") == "input_image"]  # fmt: skip


_ORDER = {"reasoning": 0, "text": 1, "call": 2}  # within one assistant turn


class _Turns:
    """Items into chat messages. An assistant's reasoning, text and calls arrive as separate
    items (in that order within a turn) and become one assistant message; a piece that comes
    out of that order starts the next assistant message."""

    def __init__(self) -> None:
        self.out: list[chat.ChatMessage] = []
        self.reasoning: list[str] = []
        self.text: list[str] = []
        self.calls: list[chat.ToolCall] = []
        self.last = -1  # the order of the latest piece of the assistant turn being built

    def assistant(self, kind: str) -> None:
        order = _ORDER[kind]
        if order < self.last or (order == self.last and kind != "call"):
            self.flush()
        self.last = order

    def flush(self) -> None:
        if self.last >= 0:
            self.out.append(chat.ChatMessage(role="assistant", content="\n".join(self.text),
                                             tool_calls=self.calls or None,
                                             reasoning_content="\n".join(self.reasoning) or None))  # fmt: skip
        self.reasoning, self.text, self.calls, self.last = [], [], [], -1

    def add(self, i: int, item: r.InputItem) -> None:
        where = f"input[{i}]"
        if isinstance(item, r.MessageItem):
            if item.role == "assistant":
                self.assistant("text")
                self.text.append(_text_of(f"{where}.content", item.content))
            else:
                self.flush()
                content = (_user_content if item.role == "user" else _text_of)(f"{where}.content", item.content)
                self.out.append(chat.ChatMessage(role=item.role, content=content))
        elif isinstance(item, r.ReasoningItem):
            self.assistant("reasoning")
            parts = item.content if item.content else item.summary
            self.reasoning.append("\n".join(p.text for p in parts))
        elif isinstance(item, r.FunctionCallItem):
            self.assistant("call")
            self.calls.append(chat.ToolCall(id=item.call_id, function=chat.FunctionCall(
                name=seen_name(item.name, item.namespace), arguments=item.arguments)))  # fmt: skip
        elif isinstance(item, r.FunctionCallOutputItem):
            self.flush()
            text = _text_of(f"{where}.output", item.output)
            self.out.append(chat.ChatMessage(role="tool", content=text, tool_call_id=item.call_id))
        else:
            self.mcp(item)

    def mcp(self, item: r.InputItem | r.OutputItem, output: bool = False) -> None:
        """An MCP item: a call is the model's call and the tool's turn with what it read; an approval
        request a call still waiting for its result; a tool list and an approval response are no
        turn (the `mcp` tool offers the tools; the approval is read by the request:
        gateway/dialects/responses/run.approvals). An approved call answers its approval request: sent
        back as input, its result is that request's tool turn; in a response's own output it is
        skipped, as the request already answered the approval request in its conversation."""
        if isinstance(item, r.McpCall) and item.approval_request_id is not None:
            if not output:
                self.flush()
                self.out.append(chat.ChatMessage(role="tool", content=for_model(item.output, item.error),
                                                 tool_call_id=item.approval_request_id))  # fmt: skip
            return
        if isinstance(item, r.McpCall | r.McpApprovalRequest):
            self.assistant("call")
            self.calls.append(chat.ToolCall(id=item.id, function=chat.FunctionCall(
                name=seen_name(item.name, item.server_label), arguments=item.arguments)))  # fmt: skip
        if isinstance(item, r.McpCall):
            self.flush()
            self.out.append(chat.ChatMessage(role="tool", content=for_model(item.output, item.error),
                                             tool_call_id=item.id))  # fmt: skip


def chat_messages(items: list[r.InputItem]) -> list[chat.ChatMessage]:
    turns = _Turns()
    for i, item in enumerate(items):
        turns.add(i, item)
    turns.flush()
    return turns.out


def answer_messages(output: list[r.OutputItem]) -> list[chat.ChatMessage]:
    """A response's output as the turns a later request continues from: the assistant's, and the
    tool turns of the MCP calls the server ran."""
    turns = _Turns()
    for item in output:
        if isinstance(item, r.Reasoning):
            turns.assistant("reasoning")
            turns.reasoning.append("\n".join(p.text for p in item.content))
        elif isinstance(item, r.OutputMessage):
            turns.assistant("text")
            turns.text.append("".join(p.text for p in item.content))
        elif isinstance(item, r.FunctionCall):
            turns.assistant("call")
            turns.calls.append(chat.ToolCall(id=item.call_id, function=chat.FunctionCall(
                name=seen_name(item.name, item.namespace), arguments=item.arguments)))  # fmt: skip
        else:
            turns.mcp(item, output=True)
    if turns.last < 0 and not turns.out:  # an answer with no output at all is still one (empty) turn
        turns.assistant("text")
    turns.flush()
    return turns.out


# ---- settings --------------------------------------------------------------------


def _response_format(text: r.TextConfig | None) -> dict[str, Any] | None:
    """`text.format` becomes the chat's response_format (the same grammar path)."""
    fmt = text.format if text is not None else None
    if isinstance(fmt, r.FormatJsonSchema):
        schema = bounded_schema(fmt.schema, "text.format.schema")
        return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": schema}}
    if isinstance(fmt, r.FormatJsonObject):
        return {"type": "json_object"}
    return None


def wants_summary(req: r.ResponsesRequest) -> bool:
    """Whether reasoning items carry their text as a summary too (`reasoning.summary`)."""
    return req.reasoning is not None and (req.reasoning.summary or req.reasoning.generate_summary) is not None


def _thinks(reasoning: r.ReasoningConfig | None) -> bool | None:
    """Whether the template is told to think: `effort: none` says no, another effort yes;
    without `reasoning`, the template's own default."""
    if reasoning is None or reasoning.effort is None:
        return None
    return reasoning.effort != "none"


class Translation(msgspec.Struct, kw_only=True):
    """A Responses request as this server runs it."""

    request: chat.ChatRequest
    conversation: list[chat.ChatMessage]  # without `instructions`: what a later request continues from
    tools: Toolset
    approvals: list[tuple[str, r.McpApprovalResponseItem]] = []  # (where, item): `mcp_approval_response`s


def _cache_salt(req: r.ResponsesRequest) -> str | None:
    """`prompt_cache_key` narrows the caller's prompt cache as `cache_salt` does (both: each)."""
    if req.prompt_cache_key is None:
        return req.cache_salt
    return f"{req.cache_salt or ''}\0{req.prompt_cache_key}"


def chat_request(req: r.ResponsesRequest, history: list[chat.ChatMessage],
                 mcp: dict[str, tuple[McpUse, list[McpTool]]] | None = None) -> Translation:  # fmt: skip
    """The chat request a Responses request means, after `history` (the conversation of its
    `previous_response_id`). Instructions are not carried over, as at OpenAI. `mcp`: the request's
    `mcp` tools by `tools[i]`, with their servers' tools."""
    items = input_items(req.input)
    approvals = [(f"input[{i}]", item) for i, item in enumerate(items) if isinstance(item, r.McpApprovalResponseItem)]
    conversation = [*history, *chat_messages(items)]
    system = [chat.ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    tools = toolset(req.tools, mcp)
    choice = tool_choice(req.tool_choice, tools)
    response_format = _response_format(req.text)
    if response_format is not None and tools.chat and choice is not None and choice not in ("auto", "none"):
        # Both would constrain the output with a grammar, and one answer follows one grammar.
        raise BadRequest("`text.format`, `tool_choice`: only one output constraint per request")
    chat_req = chat.ChatRequest(
        model=req.model,
        messages=[*system, *conversation],
        tools=tools.chat,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls,
        max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        response_format=response_format,
        # Reasoning is always split into reasoning items: a Responses client never reads `<think>`
        # in its output text (chat ignores the split for tool-call requests, and so does this).
        reasoning_format="deepseek",
        enable_think=_thinks(req.reasoning),
        # The thinking budget: an exact count (a GenieX extension) wins over the effort's.
        reasoning_effort=req.reasoning.effort if req.reasoning is not None else None,
        thinking_budget_tokens=req.thinking_budget_tokens,
        user=req.user,
        stream=req.stream,
        nctx=req.nctx,
        compute=req.compute,
        keep_alive=req.keep_alive,
        cache_salt=_cache_salt(req),
        truncation=req.truncation,
    )
    return Translation(request=chat_req, conversation=conversation, tools=tools, approvals=approvals)


# ---- the response --------------------------------------------------------------


def skeleton(req: r.ResponsesRequest, tools: Toolset, response_id: str, created_at: int, model: str,
             temperature: float, top_p: float, truncation: Truncation = "disabled") -> r.Response:  # fmt: skip
    """The response before any output: the request's settings echoed (`temperature`, `top_p`: the
    values sampling uses; `tools`: those offered to the model; `truncation`: the request's, or the
    server's default)."""
    return r.Response(
        id=response_id,
        created_at=created_at,
        status="in_progress",
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        max_tool_calls=req.max_tool_calls,
        model=model,
        output=[],
        parallel_tool_calls=req.parallel_tool_calls,
        previous_response_id=req.previous_response_id,
        reasoning=req.reasoning,
        store=req.store,
        temperature=temperature,
        text=req.text or r.TextConfig(),
        tool_choice=req.tool_choice or "auto",
        tools=tools.echo,
        top_p=top_p,
        truncation=truncation,
        user=req.user,
        metadata=req.metadata or {},
    )


def usage_of(u: chat.Usage, reasoning_tokens: int) -> r.Usage:
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return r.Usage(input_tokens=u.prompt_tokens, input_tokens_details=r.InputTokensDetails(cached_tokens=cached),
                   output_tokens=u.completion_tokens,
                   output_tokens_details=r.OutputTokensDetails(reasoning_tokens=min(reasoning_tokens, u.completion_tokens)),
                   total_tokens=u.total_tokens, energy_j=u.energy_j)  # fmt: skip
