"""The Anthropic Messages dialect, translated at the edge: a `/v1/messages` request becomes the
same ChatRequest (so the same ChatPlan and the same decode path) as `/v1/chat/completions`, and
the chat answer, whole or piece by piece, becomes Anthropic's content blocks and events.

Every refusal names the Anthropic field (`messages[1].content[0]`), not the chat field it maps to.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from gateway.chat.constraints import bounded_schema
from gateway.chat.convert import tool_schema
from gateway.chat.tool_calls import arguments_object
from gateway.errors import BadRequest
from protocol import anthropic as a
from protocol import chat

# ---- request -> chat request ---------------------------------------------------

_NO_DOCUMENTS = "document blocks cannot be read here (send the text, or images of the pages)"
_ONLY_USER_IMAGES = "{kind} blocks are read in a user turn's content only"


def _text_of(blocks: list[a.TextBlock]) -> str:
    # Adjacent text blocks are one turn's paragraphs; a newline keeps their words apart.
    return "\n".join(b.text for b in blocks)


def _system(system: str | list[a.TextBlock] | None) -> list[chat.ChatMessage]:
    if system is None:
        return []
    text = system if isinstance(system, str) else _text_of(system)
    return [chat.ChatMessage(role="system", content=text)] if text else []


def _tool_result(where: str, b: a.ToolResultBlock) -> chat.ChatMessage:
    content = b.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts: list[a.TextBlock] = []
        for j, part in enumerate(content):
            if isinstance(part, a.ToolReferenceBlock):
                part = a.TextBlock(f"Tool loaded: {part.tool_name}")
            elif not isinstance(part, a.TextBlock):
                raise BadRequest(
                    f"`{where}.content[{j}]`: " + _ONLY_USER_IMAGES.format(kind=part.__struct_config__.tag)
                )
            texts.append(part)
        text = _text_of(texts)
    if b.is_error:  # the chat templates have no error flag; the model reads it in the text
        text = f"Error: {text}"
    return chat.ChatMessage(role="tool", content=text, tool_call_id=b.tool_use_id)


def _image_part(where: str, b: a.ImageBlock) -> chat.ContentPart:
    """An image block as the chat's `image_url` part: the gateway reads it as for chat completions."""
    kind = b.source.get("type")
    if kind == "base64":
        media_type, data = b.source.get("media_type"), b.source.get("data")
        if not isinstance(media_type, str) or not isinstance(data, str) or not data:
            raise BadRequest(f"`{where}.source`: a base64 image needs `media_type` and `data` strings")
        url = f"data:{media_type};base64,{data}"
    elif kind == "url":
        given = b.source.get("url")
        if not isinstance(given, str) or not given:
            raise BadRequest(f"`{where}.source.url`: a url image needs its URL as a string")
        url = given
    else:
        raise BadRequest(f"`{where}.source.type`: an image source is `base64` or `url` here")
    return chat.ContentPart(type="image_url", image_url=chat.ImageURL(url=url))


def _user_turn(i: int, blocks: list[a.InputBlock]) -> list[chat.ChatMessage]:
    """A user turn's tool results become tool messages and its text and images a user message, in their order."""
    out: list[chat.ChatMessage] = []
    texts: list[a.TextBlock] = []
    parts: list[chat.ContentPart] = []  # with an image: the text and images in their order

    def flush() -> None:
        if parts:
            if texts:
                parts.append(chat.ContentPart(type="text", text=_text_of(texts)))
            out.append(chat.ChatMessage(role="user", content=list(parts)))
        elif texts:
            out.append(chat.ChatMessage(role="user", content=_text_of(texts)))
        texts.clear()
        parts.clear()

    for j, b in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if isinstance(b, a.TextBlock):
            texts.append(b)
        elif isinstance(b, a.ImageBlock):
            if texts:
                parts.append(chat.ContentPart(type="text", text=_text_of(texts)))
                texts.clear()
            parts.append(_image_part(where, b))
        elif isinstance(b, a.ToolResultBlock):
            flush()
            out.append(_tool_result(where, b))
        elif isinstance(b, a.DocumentBlock):
            raise BadRequest(f"`{where}`: " + _NO_DOCUMENTS)
        else:
            raise BadRequest(f"`{where}`: a {b.__struct_config__.tag} block belongs to an assistant turn")
    flush()
    return out


def image_fields(req: a.MessagesInput) -> list[str]:
    """Where each image of the request is, in the order of the chat messages' image parts (the
    names its errors give)."""
    return [f"messages[{i}].content[{j}]" for i, m in enumerate(req.messages) if m.role == "user"
            and isinstance(m.content, list) for j, b in enumerate(m.content) if isinstance(b, a.ImageBlock)]  # fmt: skip


def _assistant_turn(i: int, blocks: list[a.InputBlock]) -> chat.ChatMessage:
    """An assistant turn: its text, its reasoning, and its tool uses as the chat's tool calls."""
    texts: list[a.TextBlock] = []
    thinking: list[str] = []
    calls: list[chat.ToolCall] = []
    for j, b in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if isinstance(b, a.TextBlock):
            texts.append(b)
        elif isinstance(b, a.ThinkingBlock):
            thinking.append(b.thinking)
        elif isinstance(b, a.RedactedThinkingBlock):
            continue  # Anthropic's encrypted reasoning: nothing a local model can read
        elif isinstance(b, a.ToolUseBlock):
            calls.append(chat.ToolCall(id=b.id, function=chat.FunctionCall(name=b.name, arguments=json.dumps(b.input))))
        elif isinstance(b, a.ImageBlock | a.DocumentBlock):
            raise BadRequest(f"`{where}`: " + _ONLY_USER_IMAGES.format(kind=b.__struct_config__.tag))
        else:
            raise BadRequest(f"`{where}`: a {b.__struct_config__.tag} block belongs to a user turn")
    return chat.ChatMessage(role="assistant", content=_text_of(texts), tool_calls=calls or None,
                            reasoning_content="\n".join(thinking) or None)  # fmt: skip


def _system_turn(i: int, content: str | list[a.InputBlock]) -> str:
    if isinstance(content, str):
        return content
    for j, b in enumerate(content):
        if not isinstance(b, a.TextBlock):
            raise BadRequest(f"`messages[{i}].content[{j}]`: a system turn holds text blocks only")
    return _text_of(content)  # type: ignore[arg-type]


def _messages(req: a.MessagesInput) -> list[chat.ChatMessage]:
    # A system turn among the messages joins the system prompt: chat templates place a system
    # message first (some refuse one elsewhere), and a prefix that stays put keeps the prompt cache.
    system = _system(req.system)
    out: list[chat.ChatMessage] = []
    for i, m in enumerate(req.messages):
        if not m.content and not isinstance(m.content, str):
            raise BadRequest(f"`messages[{i}].content`: a turn needs at least one content block")
        if m.role == "system":
            system.append(chat.ChatMessage(role="system", content=_system_turn(i, m.content)))
        elif isinstance(m.content, str):
            out.append(chat.ChatMessage(role=m.role, content=m.content))
        elif m.role == "user":
            out.extend(_user_turn(i, m.content))
        else:
            out.append(_assistant_turn(i, m.content))
    if len(system) > 1:
        system = [chat.ChatMessage(role="system", content="\n\n".join(str(m.content) for m in system))]
    return [*system, *out]


def offered(tools: list[a.ToolDef] | None) -> list[tuple[int, a.ToolDef]]:
    """The custom tools, which the model is offered, with their places in `tools`. Anthropic's own
    tools (server tools such as `web_search_20250305` or `code_execution_...`, and the schema-less
    client tools such as `bash_20250124`) are not: they are named by `not_offered`, and the
    request is served with the rest, as on /v1/responses (gateway/dialects/responses/tools.py)."""
    return [(i, t) for i, t in enumerate(tools or []) if t.type in (None, "custom")]


def not_offered(tools: list[a.ToolDef] | None) -> list[str]:
    return [
        f"{t.type} ({t.name[:64]}, tools[{i}])" for i, t in enumerate(tools or []) if t.type not in (None, "custom")
    ]


def _tools(tools: list[a.ToolDef] | None) -> list[chat.Tool] | None:
    out = []
    for i, t in offered(tools):
        if t.input_schema is None:
            raise BadRequest(f"`tools[{i}].input_schema`: a required field is missing")
        schema = tool_schema(t.input_schema, f"tools[{i}].input_schema")
        out.append(chat.Tool(function=chat.FunctionDef(name=t.name, description=t.description, parameters=schema)))
    return out or None


def _tool_choice(choice: a.ToolChoice | None, tools: list[a.ToolDef] | None) -> str | dict[str, Any] | None:
    if choice is None:
        return None
    names = {t.name for _, t in offered(tools)}
    if isinstance(choice, a.ToolChoiceTool):
        if choice.name not in names:
            found = next((t for t in tools or [] if t.name == choice.name), None)
            why = (
                "no tool has it"
                if found is None
                else f"it is Anthropic's {found.type!r}, which this server does not run"
            )
            raise BadRequest(f"`tool_choice.name`: {choice.name[:128]!r}: {why}")
        return {"type": "function", "function": {"name": choice.name}}
    if not names:
        if isinstance(choice, a.ToolChoiceAny):
            raise BadRequest("`tool_choice`: 'any' needs a custom tool in `tools`")
        return None  # auto or none, with nothing to choose from: plain text either way
    return {"auto": "auto", "any": "required", "none": "none"}[choice.__struct_config__.tag]  # type: ignore[index]


def _thinks(thinking: a.ThinkingConfig | None) -> bool:
    return thinking is not None and thinking.type != "disabled"


def _budget(thinking: a.ThinkingConfig | None) -> int | None:
    """The thinking budget in tokens: `disabled` none, `enabled` its `budget_tokens`; else (absent,
    `adaptive`, `enabled` without one) None, the server's --reasoning-budget."""
    if thinking is None:
        return None
    if thinking.type == "disabled":
        return 0
    return thinking.budget_tokens if thinking.type == "enabled" else None


def _response_format(config: a.OutputConfig | None) -> dict[str, Any] | None:
    """Structured outputs become the chat's json_schema response format (the same grammar path)."""
    if config is None or config.format is None:
        return None
    schema = bounded_schema(config.format.schema, "output_config.format.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def chat_request(req: a.MessagesInput) -> chat.ChatRequest:
    """The chat request a Messages request (or a count_tokens body) means."""
    thinks = _thinks(req.thinking)
    forced = isinstance(req.tool_choice, a.ToolChoiceAny | a.ToolChoiceTool)
    if forced and req.output_config is not None and req.output_config.format is not None:
        # Both would constrain the output with a grammar, and one answer follows one grammar.
        raise BadRequest("`output_config.format`, `tool_choice`: only one output constraint per request")
    fields: dict[str, Any] = {}
    if isinstance(req, a.MessagesRequest):
        fields = {
            "max_tokens": req.max_tokens,
            "stop": req.stop_sequences,
            "stream": req.stream,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "user": req.metadata.user_id if req.metadata else None,
            "truncation": req.truncation,
        }
    return chat.ChatRequest(
        model=req.model,
        messages=_messages(req),
        tools=_tools(req.tools),
        tool_choice=_tool_choice(req.tool_choice, req.tools),
        parallel_tool_calls=False if getattr(req.tool_choice, "disable_parallel_tool_use", False) else None,
        # Anthropic models think only when asked; templates that read the flag (Qwen3 and the like)
        # are told so either way, and asked-for reasoning comes back split into thinking blocks.
        enable_think=thinks,
        reasoning_format="deepseek" if thinks else None,
        thinking_budget_tokens=_budget(req.thinking),
        response_format=_response_format(req.output_config),
        **fields,
    )


# ---- chat answer -> message ----------------------------------------------------


def tool_use_id(call_id: str) -> str:
    """Anthropic's id spelling for the chat's call id (`call_abc` -> `toolu_abc`)."""
    return "toolu_" + call_id.removeprefix("call_")


def blocks_of(message: chat.AssistantMessage) -> list[a.OutputBlock]:
    """The content blocks of a whole answer: thinking, text, then the tool uses, as a stream orders them."""
    blocks: list[a.OutputBlock] = []
    if message.reasoning_content:
        blocks.append(a.ThinkingBlock(thinking=message.reasoning_content))
    if message.content:
        blocks.append(a.TextBlock(text=message.content))
    for call in message.tool_calls or []:
        blocks.append(a.ToolUseBlock(id=tool_use_id(call.id), name=call.function.name,
                                     input=arguments_object(call.function.arguments)))  # fmt: skip
    return blocks


def stop_reason(finish_reason: str | None, stop_sequence: str) -> a.StopReason:
    """Anthropic's stop reason for the chat's finish reason (after tool-call shaping)."""
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence else "end_turn"


def usage_of(u: chat.Usage) -> a.Usage:
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return a.Usage(input_tokens=u.prompt_tokens - cached, output_tokens=u.completion_tokens,
                   cache_read_input_tokens=cached,
                   energy_j=u.energy_j if u.energy_j is not None else msgspec.UNSET)  # fmt: skip


def message_id(completion_id: str) -> str:
    return "msg_" + completion_id.rpartition("-")[2]


def message_of(completion: chat.ChatCompletion, stop_sequence: str) -> a.Message:
    """The non-streamed answer: one choice (Messages has no `n`) as a Message."""
    choice = completion.choices[0]
    return a.Message(id=message_id(completion.id), model=completion.model, content=blocks_of(choice.message),
                     stop_reason=stop_reason(choice.finish_reason, stop_sequence),
                     stop_sequence=stop_sequence or None, usage=usage_of(completion.usage),
                     truncated=completion.truncated)  # fmt: skip


# ---- chat pieces -> stream events ----------------------------------------------


class BlockStream:
    """Turns the chat shaper's pieces (reasoning, content, tool-call fragments) into Anthropic's
    content-block events: a block opens when its kind of output starts, and closes when another
    kind starts or the answer ends. Tool arguments go out as `input_json_delta` fragments, exactly
    as the model writes them, so they concatenate to the call's JSON."""

    def __init__(self) -> None:
        self.index = -1  # the open block's index; -1: none yet
        self.kind = ""  # "thinking", "text" or "tool_use"; "": none open

    def _open(self, block: a.OutputBlock, out: list[a.StreamEvent]) -> None:
        self._close(out)
        self.index += 1
        self.kind = block.__struct_config__.tag  # type: ignore[assignment]
        out.append(a.ContentBlockStart(self.index, block))

    def _close(self, out: list[a.StreamEvent]) -> None:
        if self.kind:
            out.append(a.ContentBlockStop(self.index))
            self.kind = ""

    def feed(self, delta: chat.ChunkDelta) -> list[a.StreamEvent]:
        out: list[a.StreamEvent] = []
        if delta.reasoning_content:
            if self.kind != "thinking":
                self._open(a.ThinkingBlock(thinking=""), out)
            out.append(a.ContentBlockDelta(self.index, a.ThinkingDelta(delta.reasoning_content)))
        if delta.content:
            if self.kind != "text":
                self._open(a.TextBlock(text=""), out)
            out.append(a.ContentBlockDelta(self.index, a.TextDelta(delta.content)))
        for call in delta.tool_calls or []:
            if call.id is not None:  # a new call: its id and name come first, then its arguments
                self._open(a.ToolUseBlock(id=tool_use_id(call.id), name=call.function.name or "", input={}), out)
            if call.function.arguments:
                out.append(a.ContentBlockDelta(self.index, a.InputJsonDelta(call.function.arguments)))
        return out

    def text(self, text: str) -> list[a.StreamEvent]:
        """Plain text (a request without tools or thinking), without building a ChunkDelta."""
        out: list[a.StreamEvent] = []
        if self.kind != "text":
            self._open(a.TextBlock(text=""), out)
        out.append(a.ContentBlockDelta(self.index, a.TextDelta(text)))
        return out

    def finish(self) -> list[a.StreamEvent]:
        out: list[a.StreamEvent] = []
        self._close(out)
        return out
