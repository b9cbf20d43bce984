"""The one conversion from an OpenAI-shaped chat request to a typed plan: the worker's Generate
and how its answer is shaped."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec

from gateway.chat.constraints import bounded_schema, check_tools, constraint_of, tool_mode
from gateway.chat.reasoning import splits_reasoning
from gateway.chat.reasoning_budget import budget_of
from gateway.chat.speculation import speculation_of
from gateway.errors import BadRequest
from gateway.models.store import ModelStore
from protocol import overflow
from protocol.chat import ChatMessage, ChatRequest, GenerationRequest
from protocol.priority import Priority
from protocol.wire import Generate, ImageInput, Sampling


def _message_dict(i: int, m: ChatMessage) -> dict[str, Any]:
    content: Any = m.content
    if isinstance(content, list):
        for j, part in enumerate(content):
            if part.type == "input_audio":
                raise BadRequest(f"`messages[{i}].content[{j}]`: audio input needs a model whose projector has an "
                                 "audio encoder, and no installed model has one")  # fmt: skip
        if any(part.type == "image_url" for part in content):
            # The worker puts its own image marker where each image goes (its images in this order).
            content = [{"type": "image"} if p.type == "image_url" else {"type": "text", "text": p.text or ""}
                       for p in content]  # fmt: skip
        else:
            content = "".join(part.text or "" for part in content)
    d: dict[str, Any] = {"role": m.role, "content": content if content is not None else ""}
    if m.name is not None:
        d["name"] = m.name
    if m.tool_calls:
        # Templates render arguments with `tojson`, so they get the object, not its text.
        d["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": _json_or_text(c.function.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    return d


def _json_or_text(text: str) -> Any:
    """The arguments as an object when they are JSON a worker can receive; else as the text."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if fits_wire(value) else text


def fits_wire(value: Any) -> bool:
    """Whether msgpack can carry `value` to a worker: free-form JSON (tool schemas, arguments)
    may hold integers beyond 64 bits, which would fail only when the request is sent."""
    try:
        msgspec.msgpack.encode(value)
    except (OverflowError, RecursionError):
        return False
    return True


def tool_schema(schema: dict[str, Any], field: str) -> dict[str, Any]:
    """A dialect's tool schema (`field` names it), bounded as chat's are and able to reach a worker."""
    bounded_schema(schema, field)
    if not fits_wire(schema):
        raise BadRequest(f"`{field}`: holds an integer beyond 64 bits or nests too deeply")
    return schema


def _tools(req: ChatRequest) -> list[dict[str, Any]]:
    tools = [msgspec.to_builtins(t) for t in req.tools or []]
    for i, t in enumerate(tools):
        if not fits_wire(t):
            raise BadRequest(f"`tools[{i}].function.parameters`: holds an integer beyond 64 bits or nests too deeply")
    return tools


MAX_TOKEN_ID = 1 << 31  # llama.cpp's token ids are int32; the worker checks its own vocabulary
SEED_SPACE = 1 << 64  # seeds travel as uint64 (the sampler uses their low 32 bits)


def _logit_bias(bias: dict[str, float] | None) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    for key, value in (bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise BadRequest(f"`logit_bias`: keys are token ids, not {key[:40]!r}") from None
        if not 0 <= token < MAX_TOKEN_ID:
            raise BadRequest(f"`logit_bias`: {key[:40]} is not a token id")
        if not -100 <= value <= 100:
            raise BadRequest(f"`logit_bias[{key}]`: a bias is between -100 and 100")
        out.append((token, float(value)))
    return out


def cache_key(req: GenerationRequest, tenant: str = "") -> str:
    """Whose cached prompts this request may reuse: its tenant's (one tenant until the server has
    API keys), narrowed by `cache_salt`. Requests with different keys never share a prefix."""
    salt = req.cache_salt or ""
    if not tenant and not salt:
        return ""
    return hashlib.blake2s(f"{tenant}\0{salt}".encode(), digest_size=8).hexdigest()


def sampling_of(req: GenerationRequest) -> Sampling:
    defaults = Sampling()
    return Sampling(
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        top_k=defaults.top_k if req.top_k is None else req.top_k,
        min_p=defaults.min_p if req.min_p is None else req.min_p,
        repeat_penalty=defaults.repeat_penalty if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        seed=None if req.seed is None else req.seed % SEED_SPACE,
    )


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop  # count and length bounded at decoding
    return [s for s in stops if s]


def prompt_chars(messages: list[ChatMessage], truncation: str = "disabled") -> int:
    """The text the conversation carries, before its template: what the prompt at least holds.
    With `truncation: auto`, only the messages that cannot be dropped (protocol/overflow.py)."""
    if truncation == "auto":
        droppable = {i for g in overflow.groups([m.role for m in messages]) for i in g}
        messages = [m for i, m in enumerate(messages) if i not in droppable]
    total = 0
    for m in messages:
        if isinstance(m.content, str):
            total += len(m.content)
        elif m.content:
            total += sum(len(p.text or "") for p in m.content)
        total += len(m.reasoning_content or "")
        total += sum(len(c.function.arguments) for c in m.tool_calls or ())
    return total


class Shape(msgspec.Struct, frozen=True):
    """How the relay turns the worker's text into OpenAI output for this request."""

    tools: frozenset[str] | None = None  # parse tool calls among these names; None: no tools
    one_call: bool = False  # `parallel_tool_calls: false`: calls after the first are dropped
    reasoning: bool = False  # split <think> / analysis channels into reasoning_content
    logprobs: bool = False

    @property
    def plain(self) -> bool:
        return self.tools is None and not self.reasoning and not self.logprobs


def shape_of(req: ChatRequest) -> Shape:
    tools, _ = tool_mode(req)
    names = frozenset(t.function.name for t in req.tools or []) if tools != "none" else None
    # The spec: reasoning_format is ignored for tool-call requests.
    reasoning = splits_reasoning(req.reasoning_format) and names is None
    return Shape(
        tools=names, one_call=req.parallel_tool_calls is False, reasoning=reasoning, logprobs=bool(req.logprobs)
    )


class ChatPlan(msgspec.Struct, frozen=True):
    """A chat request, checked and converted once: the worker's Generate (its `req_id` is 0; the
    worker handle numbers each generation), how to shape the answer, and how many choices."""

    generate: Generate
    shape: Shape
    n: int = 1

    @property
    def draft_path(self) -> str:
        """The draft model a speculative request has its worker load ("" for none)."""
        spec = self.generate.speculation
        return spec.draft_path if spec is not None else ""

    def generations(self) -> list[Generate]:
        """One Generate per choice: seeds seed, seed+1, ... so that seeded choices differ but stay
        reproducible; only the first keeps its cache for the next turn."""
        g = self.generate
        out = [g]
        for i in range(1, self.n):
            out.append(msgspec.structs.replace(seeded(g, i), keep_cache=False))
        return out


def seeded(g: Generate, i: int) -> Generate:
    """`g` as the i-th of several samples of one prompt: its seed plus i (no seed: unchanged)."""
    seed = g.sampling.seed
    if i == 0 or seed is None:
        return g
    return msgspec.structs.replace(g, sampling=msgspec.structs.replace(g.sampling, seed=(seed + i) % SEED_SPACE))


def plan_chat(req: ChatRequest, log_id: str, store: ModelStore, grammar_dirs: list[Path],
              keep_cache: bool = False, tenant: str = "", images: list[ImageInput] | None = None,
              truncation: str = "disabled", priority: Priority = "normal") -> ChatPlan:  # fmt: skip
    """Check and convert a chat request, before any model is loaded for it.

    `store` resolves a speculative request's draft model (`spec_draft_model`);
    `grammar_dirs` are the folders `grammar_path` may read from; `truncation` is the server's
    default for a request without its own (`--truncation`); `priority` where the engine puts it
    in its queue and steps (protocol/priority.py).
    """
    tools, forced = tool_mode(req)
    check_tools(req.tools)
    if req.top_logprobs is not None and not req.logprobs:
        raise BadRequest("`top_logprobs`: requires `logprobs: true`")
    shape = shape_of(req)
    # The spec's default is true. Qwen3-style templates read `enable_thinking`; GenieX clients
    # send `enable_think`; a template that reads neither is unaffected.
    think = True if req.enable_think is None else req.enable_think
    budget = budget_of(req)
    if budget == 0:  # no thinking: a template that can leave the section out is told to
        think = False
    template_vars: dict[str, Any] = {"enable_think": think, "enable_thinking": think}
    generate = Generate(
        req_id=0,
        log_id=log_id,
        messages=[_message_dict(i, m) for i, m in enumerate(req.messages)],
        template_vars=template_vars,
        max_tokens=req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens,
        stop=stop_list(req.stop),
        sampling=sampling_of(req),
        keep_cache=keep_cache,
        cache=req.cache_prompt,
        cache_key=cache_key(req, tenant),
        speculation=speculation_of(req, store),
        constraint=constraint_of(req, grammar_dirs, tools, forced),
        logit_bias=_logit_bias(req.logit_bias),
        logprobs=(req.top_logprobs or 0) if req.logprobs else -1,
        special=shape.tools is not None or shape.reasoning,
        tools=_tools(req) if req.tools and tools != "none" else None,
        images=images or [],
        truncation="auto" if (req.truncation or truncation) == "auto" else "disabled",
        priority=priority,
        reasoning_budget=budget,
    )
    return ChatPlan(generate, shape, req.n)
