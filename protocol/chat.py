"""`/v1/chat/completions`: the OpenAI-shaped request, response and stream chunk.

Unknown request fields are ignored (clients send many); known ones are validated
here, so a bad value is a 400 naming the field before any handler runs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocol.limits import (
    MAX_LOGIT_BIAS,
    MAX_MESSAGES,
    MAX_TOOLS,
    Count,
    KeepAlive,
    Layers,
    PositiveInt,
    ReasoningBudget,
    Stop,
)
from protocol.overflow import Truncated, Truncation

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
# Any case (the spec's clients send "GPU" too); resolve_compute reads it in lower case.
Compute = Annotated[str, Meta(pattern="^(?i:cpu|gpu|npu|hybrid)$")]
ReasoningFormat = Literal["none", "deepseek", "deepseek-legacy", "auto"]
# OpenAI's efforts (Responses' too); gateway/chat/reasoning_budget.py says how many thinking tokens each is.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class ImageURL(msgspec.Struct):
    url: str
    detail: Literal["low", "high", "auto"] | None = None


class InputAudio(msgspec.Struct, omit_defaults=True):
    data: str | None = None  # base64 or a URL, as the spec says
    format: str | None = None  # OpenAI's: wav, mp3


class ContentPart(msgspec.Struct, omit_defaults=True):
    type: Literal["text", "image_url", "input_audio"]
    text: str | None = None
    image_url: ImageURL | None = None
    input_audio: InputAudio | None = None


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class ChatMessage(msgspec.Struct, omit_defaults=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    function_call: FunctionCall | None = None
    reasoning_content: str | None = None


class FunctionDef(msgspec.Struct, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct):
    function: FunctionDef
    type: Literal["function"] = "function"


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


Unit = Annotated[float, Meta(ge=0, le=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]


class GenerationRequest(msgspec.Struct, kw_only=True):
    """What chat and text completions share: the model, sampling, stop, n and placement."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Unit | None = None
    top_k: Count | None = None
    min_p: Unit | None = None
    repetition_penalty: Annotated[float, Meta(ge=0, le=100)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None  # any integer: reduced to 64 bits (the sampler uses the low 32)
    stop: Stop | None = None
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    user: str | None = None
    # GenieX extensions
    nctx: Count | None = None  # 0 or absent: the server's --nctx (the spec's own example sends 0)
    ngl: Layers | None = None  # -1 or 999 (the spec's "all"): every layer
    compute: Compute | None = None
    keep_alive: KeepAlive | None = None
    # Prompt caching: a cached prefix is reused only by requests with the same `cache_salt`
    # (vLLM's name); `cache_prompt: false` (llama-server's name) neither reuses nor keeps one.
    cache_salt: Annotated[str, Meta(max_length=256)] | None = None
    cache_prompt: bool = True


class ChatRequest(GenerationRequest, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(max_length=MAX_MESSAGES)]
    max_completion_tokens: PositiveInt | None = None
    max_tokens: PositiveInt | None = None  # deprecated alias; ignored when both are present
    enable_think: bool | None = None
    enable_json: bool = False
    reasoning_format: ReasoningFormat | None = None
    # The thinking section's budget: OpenAI's effort, or an exact count of tokens (llama-server's
    # name; -1 unlimited, 0 none), which wins; neither: the server's --reasoning-budget.
    reasoning_effort: ReasoningEffort | None = None
    thinking_budget_tokens: ReasoningBudget | None = None
    # Accepted so that clients sending them get a clear answer, not a silent ignore.
    tools: Annotated[list[Tool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # false: an answer holds at most one call (the first)
    response_format: dict[str, Any] | None = None
    grammar_string: str | None = None
    grammar_path: str | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    logit_bias: Annotated[dict[str, float], Meta(max_length=MAX_LOGIT_BIAS)] | None = None
    spec_type: str | None = None
    spec_draft_model: str | None = None
    spec_n_max: PositiveInt | None = None  # None: 3
    spec_n_min: Count | None = None  # 0/None: no minimum draft length
    spec_p_min: Unit | None = None  # 0/None: no draft-probability cut-off
    image_max_length: PositiveInt | None = None  # the spec's, for vision models; checked, unused until they exist
    # GenieX extension: a conversation longer than the context is refused (`disabled`) or loses its
    # oldest turns until it fits (`auto`, protocol/overflow.py); absent: the server's --truncation.
    truncation: Truncation | None = None


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct):
    content: list[TokenLogprob]


class AssistantMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None
    # The reasoning split off the answer (reasoning_format); `reasoning` is the same
    # text under the name other clients read.
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class CompletionTokensDetails(msgspec.Struct):
    """OpenAI's names for the draft tokens the model confirmed and refused."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    # tokens of the thinking section (`<think>` to `</think>`); absent where there was none
    reasoning_tokens: int | msgspec.UnsetType = msgspec.UNSET


class Usage(msgspec.Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # set when a KeepCache turn reused KV
    completion_tokens_details: CompletionTokensDetails | None = None  # set when it speculated or thought
    # GenieX: the answer's share of the machine's energy in joules, where the OS reports it (omitted elsewhere)
    energy_j: float | None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: str | None = None
    truncated: Truncated | msgspec.UnsetType = msgspec.UNSET  # only when messages were dropped


class ChunkFunction(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ChunkToolCall(msgspec.Struct, omit_defaults=True):
    """A call as OpenAI streams it: index, then id, type and name, then argument fragments."""

    index: int
    function: ChunkFunction
    id: str | None = None
    type: str | None = None


class ChunkDelta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(msgspec.Struct):
    index: int
    delta: ChunkDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct, omit_defaults=True):
    id: str
    object: str  # always "chat.completion.chunk"; no default, so omit_defaults keeps it
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    truncated: Truncated | None = None  # on the first chunk of each choice, when messages were dropped
