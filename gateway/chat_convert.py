"""The one conversion from an OpenAI-shaped chat request to the worker's Generate fields."""

from __future__ import annotations

from typing import Any

from gateway.errors import BadRequest
from gateway.speculation import speculation_of
from gateway.store import ModelStore
from protocol.chat import ChatMessage, ChatRequest
from protocol.wire import Sampling

# Fields this build accepts in the schema but does not implement yet. Answering 400
# is honest; silently ignoring `tools` or a JSON schema would hand agents wrong output.
_NOT_YET = {
    "tools": "tool calling",
    "response_format": "response_format",
    "grammar_string": "grammars",
    "grammar_path": "grammars",
    "logit_bias": "logit_bias",
}


def _check_supported(req: ChatRequest) -> None:
    for field, what in _NOT_YET.items():
        if getattr(req, field):
            raise BadRequest(f"`{field}`: {what} is not supported by this server version yet")
    if req.enable_json:
        raise BadRequest("`enable_json`: JSON mode is not supported by this server version yet")
    if req.logprobs:
        raise BadRequest("`logprobs`: not supported by this server version yet")
    if req.n != 1:
        raise BadRequest("`n`: only n=1 is supported by this server version")


def _message_dict(i: int, m: ChatMessage) -> dict[str, Any]:
    content = m.content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if part.type != "text":
                raise BadRequest(f"`messages[{i}].content`: part type {part.type!r} is not supported by a text model")
            texts.append(part.text or "")
        content = "".join(texts)
    d: dict[str, Any] = {"role": m.role, "content": content if content is not None else ""}
    if m.name is not None:
        d["name"] = m.name
    return d


def sampling_of(req: ChatRequest) -> Sampling:
    defaults = Sampling()
    return Sampling(
        temperature=defaults.temperature if req.temperature is None else req.temperature,
        top_p=defaults.top_p if req.top_p is None else req.top_p,
        top_k=defaults.top_k if req.top_k is None else req.top_k,
        min_p=defaults.min_p if req.min_p is None else req.min_p,
        repeat_penalty=defaults.repeat_penalty if req.repetition_penalty is None else req.repetition_penalty,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        seed=req.seed,
    )


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > 16:
        raise BadRequest("`stop`: at most 16 stop sequences")
    return [s for s in stops if s]


def generate_fields(req: ChatRequest, log_id: str, store: ModelStore) -> dict[str, Any]:
    """Keyword arguments for `Generate`, less the request id the worker handle assigns.

    `store` resolves a speculative request's draft model (`spec_draft_model`).
    """
    _check_supported(req)
    template_vars: dict[str, Any] = {}
    if req.enable_think is not None:
        # Qwen3-style templates read `enable_thinking`; GenieX clients send `enable_think`.
        template_vars = {"enable_think": req.enable_think, "enable_thinking": req.enable_think}
    return {
        "log_id": log_id,
        "messages": [_message_dict(i, m) for i, m in enumerate(req.messages)],
        "template_vars": template_vars,
        "max_tokens": req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens,
        "stop": stop_list(req.stop),
        "sampling": sampling_of(req),
        "speculation": speculation_of(req, store),
    }
