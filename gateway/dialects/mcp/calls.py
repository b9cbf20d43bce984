"""What each `/mcp` tool does: the same steps as its HTTP route, on the same in-process Services
(the model lookup, the worker, the accounting and the usage ledger), never an HTTP call to this
server itself. Every check a route makes before loading a model is made here too, and a refusal
is the route's GenieXError, which gateway/dialects/mcp/server.py turns into a tool error.

A call that ends early (its client left, or cancelled it) is cancelled here too: the SDK cancels
the task that runs it, and each worker request cancels itself on the way out, as a route's does.
"""

from __future__ import annotations

import base64
import math
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from gateway.chat.convert import plan_chat, prompt_chars
from gateway.chat.shape import ChoiceShaper
from gateway.dialects.mcp.tools import BY_NAME, TOOLS, default_model, model_for
from gateway.errors import BadRequest, Unsupported
from gateway.http import relay
from gateway.http.model_facts import facts_of
from gateway.http.model_view import model_view
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.http.vectors import split_input, vectors
from gateway.media.inputs import load_media
from gateway.media.wav import wav
from gateway.models.store import ModelEntry
from protocol import mcp_server as p
from protocol.chat import ChatMessage, ChatRequest
from protocol.languages import WHISPER_LANGUAGES
from protocol.wire import Audio, Done, Embed, Embeddings, Speak, Transcribe, Transcript

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls: the API key's label (the ledger's and the limits' name for it) and the prompt-cache tenant."""

    label: str
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    """A tool's answer: the text a model reads, the structured result, and for `speak` a WAV."""

    text: str
    result: msgspec.Struct
    wav: bytes = b""


def _set(value: T | msgspec.UnsetType) -> T | None:
    return None if isinstance(value, msgspec.UnsetType) else value


async def _answer(entry: ModelEntry, work: Awaitable[T]) -> T:
    """The worker's answer; a refusal names the model, as the routes' do."""
    try:
        return await work
    except Unsupported as exc:
        raise Unsupported(f"`model`: {entry.id} ({entry.engine}): {exc.message}") from None


def conversation(args: p.ChatArgs) -> list[ChatMessage]:
    """`system`, then `prompt` as one user turn or `messages` as they are."""
    prompt, messages = _set(args.prompt), _set(args.messages)
    if prompt is not None and messages is not None:
        raise BadRequest("`prompt`, `messages`: give one of them, not both")
    if prompt is None and messages is None:
        raise BadRequest("`prompt` or `messages` is required: the text to answer")
    if prompt is not None and not prompt.strip():
        raise BadRequest("`prompt` is empty")
    if messages is not None and not messages:
        raise BadRequest("`messages` is empty")
    turns = [ChatMessage(role="user", content=prompt)] if prompt is not None else \
        [ChatMessage(role=m.role, content=m.content) for m in messages or []]  # fmt: skip
    system = _set(args.system)
    return [ChatMessage(role="system", content=system), *turns] if system else turns


async def chat(services: Services, caller: Caller, args: p.ChatArgs) -> Answer:
    messages = conversation(args)
    entry = services.model_for(model_for(services, BY_NAME["chat"], args.model), "chat")
    req = ChatRequest(model=entry.id, messages=messages, max_tokens=_set(args.max_tokens),
                      temperature=_set(args.temperature))  # fmt: skip
    req = services.with_defaults(req, entry)  # the models file's, where the call has none
    plan = plan_chat(req, current_request_id() or "", services.store, services.settings.grammar_dirs,
                     tenant=caller.tenant, truncation=services.settings.truncation)  # fmt: skip
    completion = relay.Completion(entry.id, services.accounting(entry.id, caller.label, None))
    worker = await completion.guard(
        services.worker(entry, prompt_chars=prompt_chars(req.messages, plan.generate.truncation))
    )
    tool_format = worker.ready_info.tool_format if worker.ready_info else ""
    shapers = [ChoiceShaper(0, plan.shape, tool_format)]
    answer = await completion.guard(relay.collect(completion, shapers, completion.run_on(worker, plan.generations())))
    choice, usage = answer.choices[0], answer.usage
    text = choice.message.content or ""
    tokens = p.TokenUsage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
    return Answer(text, p.ChatResult(entry.id, text, choice.finish_reason or "stop", tokens))


async def embed(services: Services, caller: Caller, args: p.EmbedArgs) -> Answer:
    entry = services.model_for(model_for(services, BY_NAME["embed"], args.model), "embeddings")
    texts, _ = split_input(list(args.texts))  # the route's checks: the count, no empty text
    accounting = services.accounting(entry.id, caller.label, None)
    worker = await accounting.guard(services.worker(entry))
    message = Embed(0, current_request_id() or "", texts=texts, token_ids=None, dimensions=_set(args.dimensions) or 0)
    reply = await accounting.guard(_answer(entry, worker.call(message)))
    assert isinstance(reply, Embeddings)
    accounting.settle("ok", reply.prompt_tokens, 0)
    rows = [row.embedding for row in vectors(reply, "float")]
    result = p.EmbedResult(entry.id, reply.dim, rows, p.TokenUsage(reply.prompt_tokens, 0, reply.prompt_tokens))  # type: ignore[arg-type]
    return Answer(msgspec.json.encode(result).decode(), result)


async def transcribe(services: Services, caller: Caller, args: p.TranscribeArgs) -> Answer:
    entry = services.model_for(model_for(services, BY_NAME["transcribe"], args.model), "transcription")
    language = (_set(args.language) or "").strip().lower()
    if language and language not in WHISPER_LANGUAGES:
        raise BadRequest(f"`language`: {args.language!r} is not a language Whisper knows; give an ISO 639-1 code "
                         "such as 'en'")  # fmt: skip
    if args.audio.lstrip()[:8].lower().startswith(("http://", "https://")):
        raise BadRequest("`audio` must be the file itself, as base64 or a data: URL, not a URL to fetch")
    # Bounded as the route's upload is: at most --max-body-mb of audio, checked as it is decoded.
    audio = await load_media(args.audio, field="audio", limits=services.media)
    accounting = services.accounting(entry.id, caller.label, None)
    worker = await accounting.guard(services.worker(entry))
    message = Transcribe(0, current_request_id() or "", audio, language, _set(args.prompt) or "")
    reply = await accounting.guard(_answer(entry, worker.call(message)))
    assert isinstance(reply, Transcript)
    seconds, tokens = math.ceil(reply.duration), sum(len(s.tokens) for s in reply.segments)
    accounting.settle("ok", seconds, tokens)
    text = "".join(s.text for s in reply.segments).strip()
    usage = p.TokenUsage(seconds, tokens, seconds + tokens)
    return Answer(text, p.TranscribeResult(entry.id, text, reply.language, round(reply.duration, 3), usage))


async def _spoken(stream: AsyncIterator[Audio | Done], said: list[int]) -> tuple[bytes, int]:
    """Every sentence's PCM in order and the voice's sample rate; `said` gets the phoneme ids read."""
    chunks, rate = [], 0
    async for msg in stream:
        if isinstance(msg, Audio):
            chunks.append(msg.pcm)
            rate = msg.sample_rate
        else:
            said.append(msg.prompt_tokens)
    return b"".join(chunks), rate


async def speak(services: Services, caller: Caller, args: p.SpeakArgs) -> Answer:
    entry = services.model_for(model_for(services, BY_NAME["speak"], args.model), "speech")
    if not args.text.strip():
        raise BadRequest("`text` is empty: nothing to say")
    accounting = services.accounting(entry.id, caller.label, None)
    worker = await accounting.guard(services.worker(entry))
    said: list[int] = []
    message = Speak(0, current_request_id() or "", args.text, args.speed, voice=_set(args.voice) or "")
    pcm, rate = await accounting.guard(_answer(entry, _spoken(worker.speak(message), said)),
                                       lambda: (sum(said), 0))  # fmt: skip
    ids = sum(said)
    accounting.settle("ok", ids, 0)
    seconds = round(len(pcm) / 2 / rate, 3) if rate else 0.0
    result = p.SpeakResult(entry.id, rate, seconds, p.TokenUsage(ids, 0, ids))
    return Answer(msgspec.json.encode(result).decode(), result, wav(pcm, rate))


async def list_models(services: Services, caller: Caller, args: p.ListModelsArgs) -> Answer:
    facts = facts_of(services)
    wanted = (_set(args.capability) or "").strip().lower()
    models = []
    for e in services.store.entries():
        if facts.hidden(e.id):
            continue
        view = model_view(e, services, facts)
        if wanted and wanted not in view.capabilities:
            continue
        tools: list[str] = [t.name for t in TOOLS if t.capability is not None and t.capability in view.capabilities]
        models.append(p.ModelInfo(e.id, list(view.capabilities), view.state, e.engine, tools))
    defaults: dict[str, str | None] = {t.name: default_model(services, t) for t in TOOLS if t.capability is not None}
    result = p.ModelsResult(models, defaults)
    return Answer(msgspec.json.encode(result).decode(), result)


def audio_b64(answer: Answer) -> str:
    return base64.b64encode(answer.wav).decode("ascii")
