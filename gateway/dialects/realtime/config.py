"""A realtime session's settings: OpenAI's defaults, changed by `session.update`, with each model
resolved to one this server has (the chat model from the connection's `?model=`, the others from
the session or the server's first model of their kind).

What can be served in another way is, and the session's `substitutions` (and the log) say how, as
the Responses API serves a request without the hosted tools it cannot run: `semantic_vad` runs as
server VAD with a silence fitting its eagerness, and `noise_reduction` is not applied. What
cannot be done at all is a RealtimeProblem naming the field; the session stays as it was.
OpenAI's own model names (`whisper-1`, `gpt-4o-transcribe`, voices such as `alloy`) mean the
server's default model of that kind: a client written for OpenAI works unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from gateway.errors import GenieXError
from gateway.http.services import Services
from gateway.models.capabilities import capabilities_of
from gateway.models.store import DEFAULT_MODEL_ID, WHISPER_MODEL_ID
from gateway.supervisor.memory import worker_engine
from protocol import realtime as rt

DEFAULT_VAD = rt.TurnDetectionOut(type="server_vad", threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500,
                                  create_response=True, interrupt_response=True)  # fmt: skip
# semantic_vad's eagerness as the silence that ends a turn under server VAD. Silero hears speech, not
# whether a thought is finished, so where the client asked not to be cut off mid-sentence it waits
# longer than server_vad's 500 ms; `high` (answer as soon as possible) is server_vad's own.
SEMANTIC_SILENCE_MS = {"low": 1500, "medium": 800, "auto": 800, "high": 500}
TURN_PARAM = "session.audio.input.turn_detection"
NOISE_PARAM = "session.audio.input.noise_reduction"
NO_NOISE_REDUCTION = rt.Substitution(NOISE_PARAM, "not applied: no noise reduction runs here; VAD and Whisper hear "
                                                  "the audio as sent")  # fmt: skip
# OpenAI's names: read as "the server's default model of this kind".
OPENAI_TRANSCRIBERS = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "gpt-transcribe")


class RealtimeProblem(Exception):
    """An `error` event's content: the session goes on."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None,
                 kind: str = "invalid_request_error") -> None:  # fmt: skip
        super().__init__(message)
        self.detail = rt.ErrorDetail(type=kind, message=message, code=code, param=param)


@dataclass(frozen=True)
class SessionSettings:
    id: str
    kind: str  # "realtime" or "transcription"
    chat_model: str
    transcriber: str
    vad_model: str
    voice_model: str
    voice: str = ""  # a speaker of a multi-speaker voice model ("" its first)
    speed: float = 1.0
    instructions: str = ""
    modalities: tuple[str, ...] = ("audio",)
    turn_detection: rt.TurnDetectionOut | None = DEFAULT_VAD
    transcription: rt.TranscriptionOut | None = None  # the client asked for transcription events
    tools: tuple[rt.FunctionTool, ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    max_output_tokens: int | None = None
    temperature: float | None = None  # None: the chat model's default
    language: str = ""
    prompt: str = ""
    substitutions: tuple[rt.Substitution, ...] = ()  # what is served otherwise than the client asked
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def transcribing(self) -> bool:
        return self.kind == "transcription"

    def session(self) -> rt.Session:
        pcm = rt.PcmOut()
        audio_in = rt.AudioInputOut(format=pcm, transcription=self.transcription, turn_detection=self.turn_detection)
        notes = list(self.substitutions) or None
        if self.transcribing:
            return rt.Session(id=self.id, type="transcription", audio=rt.AudioOut(input=audio_in), substitutions=notes)
        return rt.Session(
            id=self.id, type="realtime", model=self.chat_model, instructions=self.instructions,
            output_modalities=list(self.modalities), tools=list(self.tools), tool_choice=self.tool_choice,
            max_output_tokens=self.max_output_tokens or "inf", temperature=self.temperature,
            audio=rt.AudioOut(input=audio_in, output=rt.AudioOutputOut(format=pcm, voice=self.voice or self.voice_model,
                                                                       speed=self.speed)),
            substitutions=notes,
        )  # fmt: skip


def _firsts(services: Services, *capabilities: str) -> list[str]:
    """For each capability, the id of the store's first model that has it ("" if none)."""
    found = dict.fromkeys(capabilities, "")
    for entry in services.store.entries():
        for capability in capabilities_of(worker_engine(entry), entry.path):
            if found.get(capability) == "":
                found[capability] = entry.id
    return list(found.values())


def _model(services: Services, name: str, capability: str, param: str) -> str:
    try:
        return services.model_for(name, capability).id
    except GenieXError as exc:
        raise RealtimeProblem(exc.message, "model_not_found" if exc.status == 404 else "invalid_value", param) from None


def _openai_realtime(name: str) -> bool:
    """One of OpenAI's realtime models (`gpt-realtime`, `gpt-realtime-2.1`, `gpt-4o-realtime-preview`,
    `gpt-4o-mini-realtime-preview-2024-12-17`): what OpenAI's clients name unless told otherwise."""
    n = name.lower()
    return n.startswith("gpt-") and "realtime" in n and "/" not in n


def _chat_model(services: Services, name: str, current: str | None, param: str) -> tuple[str, rt.Substitution | None]:
    """The chat model `name` names, and a note when it is one of OpenAI's realtime models, which
    here mean the session's chat model (`current`; None: the server's default); any other name
    that names no chat model is refused."""
    try:
        return _model(services, name, "chat", param), None
    except RealtimeProblem:
        if not _openai_realtime(name):
            raise
    served = current or _model(services, DEFAULT_MODEL_ID, "chat", param)
    return served, rt.Substitution(param, f"{name[:64]!r} is OpenAI's model; {served} answers (the connection's "
                                          "`?model=`, or the server's default chat model)")  # fmt: skip


def opened(services: Services, session_id: str, chat_model: str | None, intent: str | None) -> SessionSettings:
    """A new session's settings: a conversation with `chat_model` (the connection's `?model=`, or
    the default chat model), or a transcription session (`?intent=transcription`)."""
    kind = "transcription" if intent == "transcription" else "realtime"
    chat, note = DEFAULT_MODEL_ID, None
    if kind == "realtime":
        chat, note = _chat_model(services, chat_model or DEFAULT_MODEL_ID, None, "model")
    transcriber, vad, voice = _firsts(services, "transcription", "vad", "speech")
    settings = SessionSettings(id=session_id, kind=kind, chat_model=chat, transcriber=transcriber or WHISPER_MODEL_ID,
                               vad_model=vad, voice_model=voice, substitutions=(note,) if note else ())  # fmt: skip
    if kind == "transcription":
        settings = replace(
            settings, transcription=rt.TranscriptionOut(model=settings.transcriber), modalities=("text",)
        )
    return settings


def _format(fmt: rt.AudioFormat | None, param: str) -> None:
    if fmt is None:
        return
    if fmt.type != rt.PCM_FORMAT or fmt.rate not in (None, rt.PCM_RATE):
        raise RealtimeProblem(f"`{param}`: this server takes and sends only 16-bit PCM at 24 kHz "
                              f'({{"type": "audio/pcm", "rate": 24000}}), not {fmt.type!r} at {fmt.rate}',
                              "unsupported_audio_format", param)  # fmt: skip


def _turn_detection(t: rt.TurnDetection | None, now: rt.TurnDetectionOut | None, vad_model: str,
                    was_semantic: bool) -> tuple[rt.TurnDetectionOut | None, rt.Substitution | None]:  # fmt: skip
    """The turn detection that runs for `t`, and the note on how it differs from `t` (None: as asked).
    Fields `t` leaves out keep their value in `now`, but for the silence that semantic VAD chose."""
    if t is None:
        return None, None
    param = TURN_PARAM
    if t.type not in ("server_vad", "semantic_vad"):
        raise RealtimeProblem(f"`{param}.type`: `server_vad` or `semantic_vad` (which runs as server VAD), or null "
                              f"for push-to-talk, not {t.type!r}", "unsupported_turn_detection", f"{param}.type")  # fmt: skip
    if not vad_model:
        raise RealtimeProblem("server VAD needs a voice activity model, and none is installed (the `audio` extra "
                              "brings Silero VAD); set `turn_detection` to null and commit the audio yourself",
                              "model_not_found", param)  # fmt: skip
    base = now or DEFAULT_VAD
    silence = DEFAULT_VAD.silence_duration_ms if was_semantic else base.silence_duration_ms
    note = None
    if t.type == "semantic_vad":
        eagerness = t.eagerness or "auto"
        silence = SEMANTIC_SILENCE_MS[eagerness]
        note = rt.Substitution(param, f"semantic_vad (eagerness {eagerness}) runs as server_vad: a turn ends after "
                                      f"{silence} ms of silence, as no model here judges whether a thought is finished")  # fmt: skip
    detection = rt.TurnDetectionOut(
        type="server_vad",
        threshold=base.threshold if t.threshold is None else t.threshold,
        prefix_padding_ms=base.prefix_padding_ms if t.prefix_padding_ms is None else t.prefix_padding_ms,
        silence_duration_ms=silence if t.silence_duration_ms is None else t.silence_duration_ms,
        create_response=base.create_response if t.create_response is None else t.create_response,
        interrupt_response=base.interrupt_response if t.interrupt_response is None else t.interrupt_response,
        idle_timeout_ms=t.idle_timeout_ms,
    )
    return detection, note


def updated(services: Services, s: SessionSettings, new: rt.SessionConfig) -> SessionSettings:
    """`s` with what `session.update` changes; RealtimeProblem (and `s` unchanged) for what cannot be."""
    if new.type is not None and new.type != s.kind:
        raise RealtimeProblem(f"`session.type`: this is a {s.kind} session; a session's type is fixed when it opens "
                              "(connect with `?intent=transcription` for a transcription session)",
                              "invalid_value", "session.type")  # fmt: skip
    changes: dict[str, Any] = {}
    notes: dict[str, rt.Substitution | None] = {n.param: n for n in s.substitutions}  # a setting set again: its own
    if new.model is not None and not s.transcribing:
        changes["chat_model"], notes["session.model"] = _chat_model(services, new.model, s.chat_model,
                                                                    "session.model")  # fmt: skip
    if new.instructions is not None:
        changes["instructions"] = new.instructions
    if new.output_modalities is not None:
        if len(set(new.output_modalities)) != 1:
            raise RealtimeProblem('`session.output_modalities`: one of ["audio"] (speech, with its transcript) or '
                                  '["text"]', "invalid_value", "session.output_modalities")  # fmt: skip
        changes["modalities"] = tuple(new.output_modalities)
    if new.tools is not None:
        changes["tools"] = tuple(new.tools)
    if new.tool_choice is not None:
        changes["tool_choice"] = new.tool_choice
    if new.temperature is not None:
        changes["temperature"] = new.temperature
    if new.max_output_tokens is not None:
        changes["max_output_tokens"] = None if new.max_output_tokens == "inf" else new.max_output_tokens
    audio = new.audio or rt.AudioConfig()
    if audio.input is not None:
        a = audio.input
        _format(a.format, "session.audio.input.format")
        if not isinstance(a.turn_detection, msgspec.UnsetType):
            changes["turn_detection"], notes[TURN_PARAM] = _turn_detection(
                a.turn_detection, s.turn_detection, s.vad_model, was_semantic=TURN_PARAM in notes
            )
        if not isinstance(a.noise_reduction, msgspec.UnsetType):
            notes[NOISE_PARAM] = None if a.noise_reduction is None else NO_NOISE_REDUCTION
        if not isinstance(a.transcription, msgspec.UnsetType):
            changes.update(_transcription(services, s, a.transcription))
    if audio.output is not None:
        o = audio.output
        _format(o.format, "session.audio.output.format")
        if o.speed is not None:
            changes["speed"] = o.speed
        if o.voice is not None:
            changes.update(_voice(services, s, o.voice))
    changes["substitutions"] = tuple(n for n in notes.values() if n is not None)
    return replace(s, **changes)


def _transcription(services: Services, s: SessionSettings, t: rt.Transcription | None) -> dict[str, Any]:
    if t is None:
        if s.transcribing:
            raise RealtimeProblem("`session.audio.input.transcription`: a transcription session needs one",
                                  "invalid_value", "session.audio.input.transcription")  # fmt: skip
        return {"transcription": None}
    model = s.transcriber
    if t.model and t.model not in OPENAI_TRANSCRIBERS:
        model = _model(services, t.model, "transcription", "session.audio.input.transcription.model")
    language = (t.language or "").strip().lower()
    return {"transcriber": model, "language": language, "prompt": t.prompt or "",
            "transcription": rt.TranscriptionOut(model=model, language=t.language, prompt=t.prompt)}  # fmt: skip


def _voice(services: Services, s: SessionSettings, voice: str) -> dict[str, Any]:
    """`voice` names a voice (text to speech) model, or a speaker of the session's voice model; an
    OpenAI voice (`alloy`) is read by a single-speaker voice as its own."""
    try:
        entry = services.store.resolve(voice)
    except (GenieXError, ValueError):
        return {"voice": voice}  # a speaker name (or OpenAI's `alloy`): the voice model reads it
    if "speech" not in capabilities_of(worker_engine(entry), entry.path):
        raise RealtimeProblem(f"`session.audio.output.voice`: {voice!r} is not a voice (text to speech) model",
                              "invalid_value", "session.audio.output.voice")  # fmt: skip
    return {"voice_model": entry.id, "voice": ""}
