"""Ollama's native API (`/api/*`): its requests and answers, as its clients send and read them.

Only the wire shapes live here; `gateway/dialects/ollama/translate.py` translates chat and generate requests to
the one chat plan. Unknown fields are ignored (clients send `template`, `context`, `raw` …), known
ones are typed, so a bad value is a 400 naming the field. `options` is kept as a mapping and read
option by option (gateway/dialects/ollama/options.py), because its names are Ollama's, not ours.
Durations are nanoseconds and times RFC 3339, as Ollama writes them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from protocol.limits import MAX_MESSAGES, MAX_TOOLS

# What `/api/version` reports: the Ollama release whose API this one follows. Clients gate features
# on it (GitHub Copilot asks for at least 0.6.4), so it is a version of Ollama, not of GenieX.
OLLAMA_VERSION = "0.12.6"

Name = Annotated[str, Meta(min_length=1, max_length=512)]
KeepAlive = float | str  # seconds, or a Go duration ("5m", "1h30m"); negative: never unloaded
Format = str | dict[str, Any]  # "json", or a JSON schema
Think = bool | Literal["low", "medium", "high"]


# ---- requests --------------------------------------------------------------------


class ToolCallFunction(msgspec.Struct):
    name: str
    arguments: dict[str, Any] = {}  # always sent: Ollama's clients require it, {} included
    index: int = 0


class OllamaToolCall(msgspec.Struct, omit_defaults=True):
    function: ToolCallFunction
    id: str | None = None


class OllamaMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None  # base64
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None  # a tool message: the tool whose result it is
    tool_call_id: str | None = None


class ToolFunction(msgspec.Struct, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class OllamaTool(msgspec.Struct, omit_defaults=True):
    function: ToolFunction
    type: Literal["function"] = "function"


class _Generation(msgspec.Struct, kw_only=True):
    """What `/api/chat` and `/api/generate` both take."""

    model: Name
    format: Format | None = None
    options: dict[str, Any] | None = None
    stream: bool = True
    keep_alive: KeepAlive | None = None
    think: Think | None = None


class OllamaChatRequest(_Generation, kw_only=True):
    messages: Annotated[list[OllamaMessage], Meta(max_length=MAX_MESSAGES)] = []
    tools: Annotated[list[OllamaTool], Meta(max_length=MAX_TOOLS)] | None = None


class GenerateRequest(_Generation, kw_only=True):
    prompt: str | None = None
    suffix: str | None = None  # "" (the Go client's zero value, always sent) is none, as in Ollama
    system: str | None = None
    raw: bool = False
    images: list[str] | None = None


class EmbedRequest(msgspec.Struct, kw_only=True):
    model: Name
    input: str | list[str]
    truncate: bool = True
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    """The older `/api/embeddings`: one text, `prompt`."""

    model: Name
    prompt: str
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


class ModelRequest(msgspec.Struct, kw_only=True):
    """`/api/show` and `/api/delete`: `model`, or `name` as older clients send it. Ollama's own CLI
    sends both, the one it does not fill as "" (Go's zero value): empty means absent, as in Ollama."""

    model: Annotated[str, Meta(max_length=512)] | None = None
    name: Annotated[str, Meta(max_length=512)] | None = None
    verbose: bool = False

    @property
    def which(self) -> str | None:
        return self.model or self.name


class CopyRequest(msgspec.Struct, kw_only=True):
    source: Name
    destination: Name


# ---- answers ---------------------------------------------------------------------


class OutMessage(msgspec.Struct, omit_defaults=True):
    role: str
    content: str
    thinking: str | None = None
    tool_calls: list[OllamaToolCall] | None = None
    images: None = None


class _Line(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What every line of `/api/chat`'s and `/api/generate`'s answer has; the last has `done: true`,
    its reason, and the counts and durations (ns) of the answer."""

    model: str
    created_at: str
    done: bool  # always sent, false included: raw clients read it on every line
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    energy_j: float | None = None  # GenieX: the answer's share of the machine's energy, where the OS reports it


class ChatChunk(_Line, kw_only=True, omit_defaults=True):
    """One line of `/api/chat`'s answer."""

    message: OutMessage


class GenerateChunk(_Line, kw_only=True, omit_defaults=True):
    """One line of `/api/generate`'s answer."""

    response: str
    thinking: str | None = None


class Error(msgspec.Struct):
    """An error after the answer began: its last line."""

    error: str


class EmbedResponse(msgspec.Struct, kw_only=True):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class EmbeddingsResponse(msgspec.Struct):
    embedding: list[float]


class Details(msgspec.Struct, kw_only=True):
    parent_model: str = ""
    format: str
    family: str
    families: list[str] | None
    parameter_size: str
    quantization_level: str


class ListedModel(msgspec.Struct, kw_only=True):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: Details


class Tags(msgspec.Struct):
    models: list[ListedModel]


class Show(msgspec.Struct, kw_only=True):
    modelfile: str
    parameters: str
    template: str
    details: Details
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str
    license: str = ""


class RunningModel(msgspec.Struct, kw_only=True):
    name: str
    model: str
    size: int
    digest: str
    details: Details
    expires_at: str
    size_vram: int
    context_length: int


class Running(msgspec.Struct):
    models: list[RunningModel]


class Version(msgspec.Struct):
    version: str
