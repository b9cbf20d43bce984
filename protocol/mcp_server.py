"""`/mcp`, GenieX as an MCP server: each tool's arguments and its structured result.

The tools' JSON Schemas (`inputSchema`, `outputSchema`) are made from these structs, and a call's
arguments are decoded into them, so what a client is shown is what the server holds it to. Each
bound is its route's: `max_tokens` as /v1/chat/completions takes it, the texts as
/v1/embeddings, the speech text as /v1/audio/speech; the audio of `transcribe` is bounded by the
server's --max-body-mb, as the route's upload is. Optional arguments without a natural default
are UNSET rather than `None`, so that their schema is the plain type a model fills in.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocol.limits import MAX_MESSAGES, MAX_TRANSCRIPTION_PROMPT_CHARS, PositiveInt
from protocol.speech import MAX_SPEECH_CHARS, MAX_VOICE_CHARS, Speed

MAX_EMBED_TEXTS = 2048  # as /v1/embeddings takes (gateway/http/vectors.py's MAX_INPUTS)
MAX_MODEL_CHARS = 256

ModelName = Annotated[str, Meta(max_length=MAX_MODEL_CHARS, description="An installed model's id, `org/repo[:precision]` "
                                "(see `list_models`); absent: the tool's default model")]  # fmt: skip
Temperature = Annotated[float, Meta(ge=0, le=2, description="Sampling temperature, 0 to 2 (0: greedy); absent: the "
                                    "model's default")]  # fmt: skip


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Ask a local chat model. Give `prompt` (one user turn) or `messages` (a conversation), not both."""

    prompt: Annotated[str, Meta(description="The user's message")] | UnsetType = UNSET
    messages: Annotated[list[Message], Meta(max_length=MAX_MESSAGES, description="The conversation so far, oldest "
                                            "first; the model answers its last turn")] | UnsetType = UNSET  # fmt: skip
    system: Annotated[str, Meta(description="A system prompt, put before the conversation")] | UnsetType = UNSET
    model: ModelName | UnsetType = UNSET
    max_tokens: Annotated[PositiveInt, Meta(description="The most tokens to generate (the model's context bounds it "
                                            "too)")] | UnsetType = UNSET  # fmt: skip
    temperature: Temperature | UnsetType = UNSET


class EmbedArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Embed texts as vectors (L2-normalised), one per text, in order."""

    texts: Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(min_length=1, max_length=MAX_EMBED_TEXTS,
                     description="The texts to embed, none empty")]  # fmt: skip
    model: ModelName | UnsetType = UNSET
    dimensions: Annotated[PositiveInt, Meta(description="Truncate each vector to this many dimensions (models "
                                            "trained for it)")] | UnsetType = UNSET  # fmt: skip


class TranscribeArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Transcribe speech to text."""

    audio: Annotated[str, Meta(description="The audio file (WAV, MP3, OGG, FLAC, WebM, ...: any format FFmpeg reads) as "
                               "base64 or a data: URL")]  # fmt: skip
    model: ModelName | UnsetType = UNSET
    language: Annotated[str, Meta(max_length=16, description="The language spoken, an ISO 639-1 code such as `en`; "
                                  "absent: detected")] | UnsetType = UNSET  # fmt: skip
    prompt: Annotated[str, Meta(max_length=MAX_TRANSCRIPTION_PROMPT_CHARS, description="Text that conditions the "
                                "transcript: names, spellings, the style")] | UnsetType = UNSET  # fmt: skip


class SpeakArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Speak text aloud; the answer is a WAV file as MCP audio content."""

    text: Annotated[str, Meta(min_length=1, max_length=MAX_SPEECH_CHARS, description="The text to speak")]
    model: ModelName | UnsetType = UNSET
    voice: Annotated[str, Meta(max_length=MAX_VOICE_CHARS, description="A speaker of a multi-speaker voice model; "
                               "absent: its first")] | UnsetType = UNSET  # fmt: skip
    speed: Speed = 1.0


class ListModelsArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """List the installed models, what each can do, and which model each tool uses by default."""

    capability: Annotated[str, Meta(max_length=32, description="Only the models with this capability: chat, "
                                    "embeddings, transcription, speech, ...")] | UnsetType = UNSET  # fmt: skip


class TokenUsage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatResult(msgspec.Struct):
    model: str
    text: str
    finish_reason: str
    usage: TokenUsage


class EmbedResult(msgspec.Struct):
    model: str
    dimensions: int
    embeddings: list[list[float]]
    usage: TokenUsage


class TranscribeResult(msgspec.Struct):
    model: str
    text: str
    language: str
    duration_s: float
    usage: TokenUsage  # prompt_tokens: seconds of audio, rounded up, as the route bills them


class SpeakResult(msgspec.Struct):
    model: str
    sample_rate: int
    audio_seconds: float
    usage: TokenUsage  # prompt_tokens: the phoneme ids the voice read


class ModelInfo(msgspec.Struct):
    id: str
    capabilities: list[str]
    state: str  # not_loaded, loading, ready, busy, stopping, failed: as /v1/models shows it
    engine: str
    tools: list[str]  # the tools of this server it can answer


class ModelsResult(msgspec.Struct):
    models: list[ModelInfo]
    # Each tool's default model; null where none is installed (the tool's error says what to install).
    defaults: dict[str, str | None]


ToolName = Literal["chat", "embed", "transcribe", "speak", "list_models"]
