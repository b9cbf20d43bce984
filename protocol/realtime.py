"""`/v1/realtime`: the OpenAI Realtime API's events (the GA shapes the current `openai` SDK sends
and parses), as msgspec structs.

Client events are read leniently where OpenAI's clients send fields this server has no use for
(`tracing`, `include`): unknown fields are ignored, never an error. What this server serves in
its own way (`semantic_vad`, `noise_reduction`) is named in the session's `substitutions`; what it
cannot do as asked is an `error` event naming the field (gateway/dialects/realtime/config.py).
Server events carry an `event_id` each; items and responses carry `object`, as OpenAI's do.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from protocol.limits import MAX_TRANSCRIPTION_PROMPT_CHARS

# OpenAI Realtime's PCM is 16-bit little-endian mono at 24 kHz, both ways.
PCM_RATE = 24_000
PCM_FORMAT = "audio/pcm"
MAX_INSTRUCTIONS_CHARS = 64_000
MAX_TOOLS = 64
MAX_ITEM_TEXT_CHARS = 64_000
MAX_ID_CHARS = 64
Id = Annotated[str, Meta(max_length=MAX_ID_CHARS, pattern=r"^[A-Za-z0-9_.:-]*$")]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


# ---- session configuration (client side: every field optional, unknown ones ignored) ----------


class AudioFormat(msgspec.Struct, omit_defaults=True):
    type: str = PCM_FORMAT
    rate: int | None = None


class Transcription(msgspec.Struct, omit_defaults=True):
    model: Annotated[str, Meta(max_length=256)] | None = None
    language: Annotated[str, Meta(max_length=16)] | None = None
    prompt: Annotated[str, Meta(max_length=MAX_TRANSCRIPTION_PROMPT_CHARS)] | None = None


class TurnDetection(msgspec.Struct, omit_defaults=True):
    type: str = "server_vad"
    eagerness: Literal["low", "medium", "high", "auto"] | None = None  # semantic_vad's
    threshold: Annotated[float, Meta(ge=0, le=1)] | None = None
    prefix_padding_ms: Annotated[int, Meta(ge=0, le=10_000)] | None = None
    silence_duration_ms: Annotated[int, Meta(ge=0, le=10_000)] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: Annotated[int, Meta(ge=0)] | None = None


class AudioInputConfig(msgspec.Struct, omit_defaults=True):
    format: AudioFormat | None = None
    transcription: Transcription | UnsetType | None = UNSET  # null: no transcription events
    turn_detection: TurnDetection | UnsetType | None = UNSET  # null: push-to-talk (the client commits)
    # Read only to say that none runs here (null: the client asks for none).
    noise_reduction: dict[str, Any] | UnsetType | None = UNSET


class AudioOutputConfig(msgspec.Struct, omit_defaults=True):
    format: AudioFormat | None = None
    voice: Annotated[str, Meta(max_length=256)] | None = None
    speed: Annotated[float, Meta(ge=0.25, le=4.0)] | None = None


class AudioConfig(msgspec.Struct, omit_defaults=True):
    input: AudioInputConfig | None = None
    output: AudioOutputConfig | None = None


class FunctionTool(msgspec.Struct, omit_defaults=True):
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    type: Literal["function"] = "function"
    description: Annotated[str, Meta(max_length=4096)] | None = None
    parameters: dict[str, Any] | None = None


Modality = Literal["text", "audio"]
MaxTokens = Annotated[int, Meta(ge=1)] | Literal["inf"]


class SessionConfig(msgspec.Struct, omit_defaults=True):
    """`session.update`'s `session`: what it names changes, the rest stays."""

    type: Literal["realtime", "transcription"] | None = None
    model: Annotated[str, Meta(max_length=256)] | None = None
    instructions: Annotated[str, Meta(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    output_modalities: Annotated[list[Modality], Meta(min_length=1, max_length=2)] | None = None
    audio: AudioConfig | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: MaxTokens | None = None
    # The beta API's sampling temperature (GA dropped it); kept as an extension: 0 answers greedily.
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None


# ---- conversation items (both sides) ------------------------------------------------------------


class ContentPart(msgspec.Struct, omit_defaults=True):
    """`input_text`, `input_audio` (base64 PCM, its `transcript` once known), `output_text` or
    `output_audio` (whose audio is never repeated in an item: the deltas carried it)."""

    type: Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
    text: Annotated[str, Meta(max_length=MAX_ITEM_TEXT_CHARS)] | None = None
    audio: str | None = None
    transcript: str | None = None


class Item(msgspec.Struct, omit_defaults=True):
    """A conversation item: a `message` (system, user or assistant), a `function_call` or a
    `function_call_output`. One struct for all three, as clients send them with only their own fields."""

    type: Literal["message", "function_call", "function_call_output"]
    id: Id | None = None
    object: Literal["realtime.item"] = "realtime.item"
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    role: Literal["system", "user", "assistant"] | None = None
    content: Annotated[list[ContentPart], Meta(max_length=32)] | None = None
    call_id: Id | None = None
    name: Annotated[str, Meta(max_length=64)] | None = None
    arguments: Annotated[str, Meta(max_length=MAX_ITEM_TEXT_CHARS)] | None = None
    output: Annotated[str, Meta(max_length=MAX_ITEM_TEXT_CHARS)] | None = None


# ---- client events ------------------------------------------------------------------------------


class ClientEvent(msgspec.Struct, tag_field="type", omit_defaults=True):
    event_id: Annotated[str, Meta(max_length=MAX_ID_CHARS)] | None = None


class SessionUpdate(ClientEvent, tag="session.update"):
    session: SessionConfig = msgspec.field(default_factory=SessionConfig)


class InputAudioBufferAppend(ClientEvent, tag="input_audio_buffer.append"):
    audio: str = ""


class InputAudioBufferCommit(ClientEvent, tag="input_audio_buffer.commit"):
    pass


class InputAudioBufferClear(ClientEvent, tag="input_audio_buffer.clear"):
    pass


class OutputAudioBufferClear(ClientEvent, tag="output_audio_buffer.clear"):
    pass


class ConversationItemCreate(ClientEvent, tag="conversation.item.create"):
    item: Item = msgspec.field(default_factory=lambda: Item(type="message"))
    previous_item_id: Id | None = None


class ConversationItemDelete(ClientEvent, tag="conversation.item.delete"):
    item_id: Id = ""


class ConversationItemRetrieve(ClientEvent, tag="conversation.item.retrieve"):
    item_id: Id = ""


class ConversationItemTruncate(ClientEvent, tag="conversation.item.truncate"):
    item_id: Id = ""
    content_index: Annotated[int, Meta(ge=0)] = 0
    audio_end_ms: Annotated[int, Meta(ge=0)] = 0


class ResponseParams(msgspec.Struct, omit_defaults=True):
    """`response.create`'s `response`: this response's own settings over the session's."""

    instructions: Annotated[str, Meta(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    output_modalities: Annotated[list[Modality], Meta(min_length=1, max_length=2)] | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: MaxTokens | None = None
    conversation: str | None = None  # "auto" (the default) or "none": out of band, not added to the conversation
    input: Annotated[list[Item], Meta(max_length=256)] | None = None
    metadata: dict[str, str] | None = None


class ResponseCreate(ClientEvent, tag="response.create"):
    response: ResponseParams | None = None


class ResponseCancel(ClientEvent, tag="response.cancel"):
    response_id: Id | None = None


ClientEvents = (
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | OutputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemDelete
    | ConversationItemRetrieve
    | ConversationItemTruncate
    | ResponseCreate
    | ResponseCancel
)
CLIENT_EVENT_TYPES = frozenset(t.__struct_config__.tag for t in ClientEvents.__args__)


# ---- server events ------------------------------------------------------------------------------


class ServerEvent(msgspec.Struct, tag_field="type", kw_only=True):
    event_id: str = msgspec.field(default_factory=lambda: new_id("event"))


class ErrorDetail(msgspec.Struct, omit_defaults=True):
    type: str
    message: str
    code: str | None = None
    param: str | None = None
    event_id: str | None = None  # the client event that caused it


class Error(ServerEvent, tag="error"):
    error: ErrorDetail


class PcmOut(msgspec.Struct):
    type: str = PCM_FORMAT
    rate: int = PCM_RATE


class TurnDetectionOut(msgspec.Struct):
    type: str
    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    create_response: bool
    interrupt_response: bool
    idle_timeout_ms: int | None = None


class TranscriptionOut(msgspec.Struct):
    model: str
    language: str | None = None
    prompt: str | None = None


class AudioInputOut(msgspec.Struct):
    format: PcmOut
    transcription: TranscriptionOut | None
    turn_detection: TurnDetectionOut | None
    noise_reduction: None = None


class AudioOutputOut(msgspec.Struct):
    format: PcmOut
    voice: str
    speed: float


class Substitution(msgspec.Struct):
    """A setting served otherwise than asked (an extension of `session`): `param` names it as an
    error would, `message` says what runs instead."""

    param: str
    message: str


class AudioOut(msgspec.Struct, omit_defaults=True):
    input: AudioInputOut
    output: AudioOutputOut | None = None


class Session(msgspec.Struct, omit_defaults=True):
    """The session as it stands, in session.created and session.updated."""

    id: str
    type: Literal["realtime", "transcription"]
    audio: AudioOut
    object: str = "realtime.session"
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[str] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    temperature: float | None = None
    expires_at: int | None = None
    substitutions: list[Substitution] | None = None


class _SessionEvent(ServerEvent):
    session: Session


class SessionCreated(_SessionEvent, tag="session.created"):
    pass


class SessionUpdated(_SessionEvent, tag="session.updated"):
    pass


class _ConversationItemEvent(ServerEvent):
    item: Item
    previous_item_id: str | None = None


class ConversationItemAdded(_ConversationItemEvent, tag="conversation.item.added"):
    pass


class ConversationItemDone(_ConversationItemEvent, tag="conversation.item.done"):
    pass


class ConversationItemDeleted(ServerEvent, tag="conversation.item.deleted"):
    item_id: str


class ConversationItemRetrieved(ServerEvent, tag="conversation.item.retrieved"):
    item: Item


class ConversationItemTruncated(ServerEvent, tag="conversation.item.truncated"):
    item_id: str
    content_index: int
    audio_end_ms: int


class SpeechStarted(ServerEvent, tag="input_audio_buffer.speech_started"):
    audio_start_ms: int
    item_id: str


class SpeechStopped(ServerEvent, tag="input_audio_buffer.speech_stopped"):
    audio_end_ms: int
    item_id: str


class Committed(ServerEvent, tag="input_audio_buffer.committed"):
    item_id: str
    previous_item_id: str | None = None


class Cleared(ServerEvent, tag="input_audio_buffer.cleared"):
    pass


class DurationUsage(msgspec.Struct):
    seconds: float
    type: str = "duration"


class _TranscriptionEvent(ServerEvent):
    """An event of a user audio part's transcription."""

    item_id: str
    content_index: int


class TranscriptionDelta(_TranscriptionEvent, tag="conversation.item.input_audio_transcription.delta"):
    delta: str


class TranscriptionCompleted(_TranscriptionEvent, tag="conversation.item.input_audio_transcription.completed"):
    transcript: str
    usage: DurationUsage


class TranscriptionFailed(_TranscriptionEvent, tag="conversation.item.input_audio_transcription.failed"):
    error: ErrorDetail


class InputTokenDetails(msgspec.Struct):
    text_tokens: int = 0
    audio_tokens: int = 0
    cached_tokens: int = 0


class OutputTokenDetails(msgspec.Struct):
    text_tokens: int = 0
    audio_tokens: int = 0


class ResponseUsage(msgspec.Struct):
    """The chat model's tokens; `audio_tokens` stay 0, as no model here reads or writes audio tokens
    (speech goes through Whisper and Piper, whose own use is in the usage ledger)."""

    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: InputTokenDetails = msgspec.field(default_factory=InputTokenDetails)
    output_token_details: OutputTokenDetails = msgspec.field(default_factory=OutputTokenDetails)


class StatusDetails(msgspec.Struct, omit_defaults=True):
    type: str
    reason: str | None = None
    error: ErrorDetail | None = None


class Response(msgspec.Struct, omit_defaults=True):
    id: str
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]
    object: str = "realtime.response"
    output: list[Item] = []
    output_modalities: list[str] = []
    conversation_id: str | None = None
    status_details: StatusDetails | None = None
    usage: ResponseUsage | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    metadata: dict[str, str] | None = None


class _ResponseEvent(ServerEvent):
    response: Response


class ResponseCreated(_ResponseEvent, tag="response.created"):
    pass


class ResponseDone(_ResponseEvent, tag="response.done"):
    pass


class _OutputItemEvent(ServerEvent):
    response_id: str
    output_index: int
    item: Item


class OutputItemAdded(_OutputItemEvent, tag="response.output_item.added"):
    pass


class OutputItemDone(_OutputItemEvent, tag="response.output_item.done"):
    pass


class Part(msgspec.Struct, omit_defaults=True):
    type: Literal["text", "audio"]
    text: str | None = None
    transcript: str | None = None


class PartEvent(ServerEvent):
    """An event of one content part of a response's item."""

    response_id: str
    item_id: str
    output_index: int
    content_index: int


class ContentPartAdded(PartEvent, tag="response.content_part.added"):
    part: Part


class ContentPartDone(PartEvent, tag="response.content_part.done"):
    part: Part


class OutputTextDelta(PartEvent, tag="response.output_text.delta"):
    delta: str


class OutputTextDone(PartEvent, tag="response.output_text.done"):
    text: str


class OutputAudioTranscriptDelta(PartEvent, tag="response.output_audio_transcript.delta"):
    delta: str


class OutputAudioTranscriptDone(PartEvent, tag="response.output_audio_transcript.done"):
    transcript: str


class OutputAudioDelta(PartEvent, tag="response.output_audio.delta"):
    delta: str  # base64 PCM


class OutputAudioDone(PartEvent, tag="response.output_audio.done"):
    pass


class _CallEvent(ServerEvent):
    """An event of a function_call item's arguments."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str


class FunctionCallArgumentsDelta(_CallEvent, tag="response.function_call_arguments.delta"):
    delta: str


class FunctionCallArgumentsDone(_CallEvent, tag="response.function_call_arguments.done"):
    name: str
    arguments: str
