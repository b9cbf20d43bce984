"""`/v1/completions`: OpenAI's legacy text completion (editors use it, with `suffix`, to fill in the middle)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from protocol.chat import GenerationRequest, Usage
from protocol.limits import PositiveInt


class CompletionRequest(GenerationRequest, kw_only=True):
    prompt: str | list[str]
    suffix: str | None = None
    max_tokens: PositiveInt = 16
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None


class CompletionLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class TextCompletion(msgspec.Struct, omit_defaults=True):
    id: str
    object: str  # "text_completion", for the body and every chunk
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
