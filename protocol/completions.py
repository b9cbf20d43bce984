"""`/v1/completions`: OpenAI's legacy text completion (editors use it, with `suffix`, to fill in the middle)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from protocol.chat import Compute, Penalty, PositiveInt, StreamOptions, Unit, Usage


class CompletionRequest(msgspec.Struct, kw_only=True):
    model: str
    prompt: str | list[str]
    suffix: str | None = None
    max_tokens: PositiveInt = 16
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Unit | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    min_p: Unit | None = None
    repetition_penalty: Annotated[float, Meta(ge=0, le=100)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    echo: bool = False
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    nctx: PositiveInt | None = None
    ngl: int | None = None
    compute: Compute | None = None
    keep_alive: float | None = None


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
