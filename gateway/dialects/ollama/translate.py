"""Ollama's chat and generate requests as the one chat request, and the chat answer as Ollama's.

`/api/chat` and `/api/generate` become the same ChatRequest as `/v1/chat/completions` (so the
same plan, worker path and accounting); `/api/generate` with `raw` or a `suffix` is a raw text
prompt instead (the completions path: no template, fill-in-the-middle with a suffix). Every
refusal names the Ollama field.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from datetime import UTC, datetime
from typing import Any

import msgspec

from gateway.chat.tool_calls import arguments_object
from gateway.dialects.ollama.options import chat_fields
from gateway.errors import BadRequest
from protocol import chat
from protocol import ollama as o

# The image formats a base64 string's first bytes name; what chat_images reads from a data URL.
_MAGIC = ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"), (b"RIFF", "image/webp"),
          (b"BM", "image/bmp"))  # fmt: skip
TOOL_CHOICE_HEADER = "geniex-tool-choice"  # Ollama has no tool_choice; a client that can set headers forces one so


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _image_url(where: str, data: str) -> chat.ContentPart:
    """A base64 image as the chat's image part; its type read from its first bytes."""
    try:
        head = base64.b64decode(data[:32] + "=" * (-len(data[:32]) % 4), validate=False)
    except (binascii.Error, ValueError):
        raise BadRequest(f"`{where}`: not base64") from None
    media = next((m for magic, m in _MAGIC if head.startswith(magic)), "image/png")
    return chat.ContentPart(type="image_url", image_url=chat.ImageURL(url=f"data:{media};base64,{data}"))


def _content(where: str, text: str | None, images: list[str] | None) -> str | list[chat.ContentPart]:
    if not images:
        return text or ""
    parts = [_image_url(f"{where}.images[{j}]", img) for j, img in enumerate(images)]
    return [*parts, chat.ContentPart(type="text", text=text or "")]


def _arguments(args: dict[str, Any]) -> str:
    return json.dumps(args, ensure_ascii=False)


def messages_of(messages: list[o.OllamaMessage]) -> list[chat.ChatMessage]:
    """Ollama's messages as chat messages. Ollama's tool calls have no ids; each gets one, and a
    tool message answers the earliest unanswered call of its `tool_name` (else the earliest)."""
    out: list[chat.ChatMessage] = []
    pending: list[tuple[str, str]] = []  # (call id, tool name) not yet answered
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.role == "assistant":
            calls = [chat.ToolCall(id=c.id or f"call_{i}_{j}", function=chat.FunctionCall(c.function.name,
                                                                                          _arguments(c.function.arguments)))
                     for j, c in enumerate(m.tool_calls or [])]  # fmt: skip
            pending += [(c.id, c.function.name) for c in calls]
            out.append(chat.ChatMessage(role="assistant", content=m.content or "", tool_calls=calls or None,
                                        reasoning_content=m.thinking or None))  # fmt: skip
            if m.images:
                raise BadRequest(f"`{where}.images`: images are read in user messages only")
        elif m.role == "tool":
            match = next((p for p in pending if m.tool_call_id == p[0] or (m.tool_name and p[1] == m.tool_name)),
                         pending[0] if pending else None)  # fmt: skip
            if match is not None:
                pending.remove(match)
            out.append(chat.ChatMessage(role="tool", content=m.content or "",
                                        tool_call_id=match[0] if match else m.tool_call_id or "call_0"))  # fmt: skip
        else:
            if m.images and m.role != "user":
                raise BadRequest(f"`{where}.images`: images are read in user messages only")
            out.append(chat.ChatMessage(role=m.role, content=_content(where, m.content, m.images)))
    return out


def _response_format(fmt: o.Format | None) -> dict[str, Any] | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise BadRequest('`format`: expected "json" or a JSON schema object')


def _think(think: o.Think | None) -> dict[str, Any]:
    """`think`: true (or an effort) asks for reasoning, returned apart in `thinking`; false asks the
    template not to; absent leaves the model to its default, its reasoning still kept apart."""
    if think is None:
        return {"reasoning_format": "deepseek"}
    if think is False:  # no thinking at all: a section the model opens anyway is closed at once
        return {"enable_think": False, "thinking_budget_tokens": 0}
    if think is True:
        return {"enable_think": True, "reasoning_format": "deepseek"}
    # An effort: its budget in tokens (gateway/chat/reasoning_budget.py).
    return {"enable_think": True, "reasoning_format": "deepseek", "reasoning_effort": think}


def _tool_choice(header: str | None, tools: list[o.OllamaTool] | None) -> str | dict[str, Any] | None:
    value = (header or "").strip()
    if not value or value == "auto":
        return None
    if value in ("none", "required"):
        return value
    if tools and value in {t.function.name for t in tools}:
        return {"type": "function", "function": {"name": value}}
    raise BadRequest(f"`{TOOL_CHOICE_HEADER}` header: auto, none, required or the name of one of `tools`")


def _request(model: str, messages: list[chat.ChatMessage], fields: dict[str, Any]) -> chat.ChatRequest:
    try:
        return msgspec.convert({"model": model, "messages": messages, **fields}, chat.ChatRequest,
                               from_attributes=True)  # fmt: skip
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid request: {_ollama_names(str(exc))}") from None


# Chat field -> the Ollama option it came from, for a refusal that names what the client sent.
_OPTION_OF = {"temperature": "options.temperature", "top_p": "options.top_p", "top_k": "options.top_k",
              "min_p": "options.min_p", "seed": "options.seed", "stop": "options.stop",
              "max_tokens": "options.num_predict", "nctx": "options.num_ctx", "ngl": "options.num_gpu",
              "repetition_penalty": "options.repeat_penalty", "presence_penalty": "options.presence_penalty",
              "frequency_penalty": "options.frequency_penalty", "keep_alive": "keep_alive"}  # fmt: skip


def _ollama_names(message: str) -> str:
    for ours, theirs in _OPTION_OF.items():
        message = message.replace(f"`$.{ours}`", f"`{theirs}`")
    return message


def chat_request(
    req: o.OllamaChatRequest, keep_alive: float | None, tool_choice: str | None = None
) -> chat.ChatRequest:
    """The chat request an `/api/chat` request means."""
    fields = chat_fields(req.options)
    tools = [chat.Tool(function=chat.FunctionDef(t.function.name, t.function.description, t.function.parameters))
             for t in req.tools] if req.tools else None  # fmt: skip
    fields.update(
        _think(req.think),
        stream=req.stream,
        tools=tools,
        keep_alive=keep_alive,
        tool_choice=_tool_choice(tool_choice, req.tools),
        response_format=_response_format(req.format),
    )
    return _request(req.model, messages_of(req.messages), fields)


def generate_request(req: o.GenerateRequest, keep_alive: float | None) -> chat.ChatRequest:
    """The chat request an `/api/generate` request (not raw, no suffix) means: its `system` and
    `prompt` (with its images) as a system and a user turn."""
    fields = chat_fields(req.options)
    fields.update(_think(req.think), stream=req.stream, keep_alive=keep_alive,
                  response_format=_response_format(req.format))  # fmt: skip
    messages = [chat.ChatMessage(role="system", content=req.system)] if req.system else []
    messages.append(chat.ChatMessage(role="user", content=_content("prompt", req.prompt, req.images)))
    return _request(req.model, messages, fields)


def raw_request(req: o.GenerateRequest) -> chat.ChatRequest:
    """A raw `/api/generate` (text in, text out) as a chat request without messages: its sampling
    and limits, checked as a chat request's are (the prompt itself goes to the worker as text)."""
    if req.format not in (None, ""):
        raise BadRequest("`format`: not with `raw` or `suffix` (a raw prompt has no JSON mode here)")
    if req.images:
        raise BadRequest("`images`: not with `raw` or `suffix` (a raw prompt has no image slots)")
    return _request(req.model, [], chat_fields(req.options))


# ---- answer ----------------------------------------------------------------------


def tool_calls_of(calls: list[chat.ToolCall] | None) -> list[o.OllamaToolCall] | None:
    """The answer's calls with their arguments as objects, as Ollama's clients read them."""
    if not calls:
        return None
    return [o.OllamaToolCall(function=o.ToolCallFunction(c.function.name, arguments_object(c.function.arguments), index=i),
                       id=c.id) for i, c in enumerate(calls)]  # fmt: skip


def done_reason(finish_reason: str | None) -> str:
    """Ollama says `stop` (tool calls included) or `length`."""
    return "length" if finish_reason == "length" else "stop"


class Clock:
    """The durations an Ollama answer ends with, measured here in the gateway (ns): the load (until
    the worker is ready), the prompt (until the first token), and the decode (to the last)."""

    def __init__(self) -> None:
        self.start = time.perf_counter_ns()
        self.loaded = self.start
        self.first: int | None = None

    def ready(self) -> None:
        self.loaded = time.perf_counter_ns()

    def token(self) -> None:
        if self.first is None:
            self.first = time.perf_counter_ns()

    def timings(self, prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        """The fields of Ollama's last line (protocol/ollama.py's _Line) that count and time the answer."""
        end = time.perf_counter_ns()
        first = self.first or end
        return {"total_duration": end - self.start, "load_duration": self.loaded - self.start,
                "prompt_eval_count": prompt_tokens, "prompt_eval_duration": max(first - self.loaded, 0),
                "eval_count": completion_tokens, "eval_duration": max(end - first, 0)}  # fmt: skip
