"""One realtime response: the conversation so far as a chat request, the chat model's answer as
the Realtime API's events (a message item whose part is text, or audio with its transcript, and a
function_call item per tool call), spoken sentence by sentence (gateway/dialects/realtime/speaker.py).

The chat round is planned, run and billed as a chat completion is (gateway/http/dialect_stream.py
drives it through the same ChoiceShaper: tool calls parsed, reasoning kept out of the answer).
Cancelled (`response.cancel`, or the user speaking over it), the generation and the sentence being
spoken are cancelled on their workers, and an audio answer is cut to what was heard.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import msgspec
import structlog

from gateway.chat.convert import plan_chat, prompt_chars
from gateway.chat.shape import ChoiceShaper
from gateway.dialects.realtime.config import SessionSettings
from gateway.dialects.realtime.sentences import Sentences
from gateway.dialects.realtime.speaker import Speaker
from gateway.errors import GenieXError
from gateway.http import dialect_stream, relay
from protocol import chat
from protocol import realtime as rt
from protocol.chat import ChunkDelta, ChunkToolCall
from protocol.wire import Done

log = structlog.get_logger("gateway.realtime")

Send = Callable[[rt.ServerEvent], Awaitable[None]]
P = TypeVar("P", bound=rt.PartEvent)


class _Call:
    def __init__(self, item: rt.Item, index: int) -> None:
        self.item = item
        self.index = index
        self.arguments = ""


class ResponseRun:
    def __init__(self, session: Any, settings: SessionSettings, params: rt.ResponseParams,
                 messages: Callable[[], Awaitable[list[chat.ChatMessage]]], send: Send,
                 speech_ended: float | None = None) -> None:  # fmt: skip
        self.session = session  # gateway/dialects/realtime/session.py's RealtimeSession: services, caller, conversation
        self.settings = settings
        self.params = params
        self.messages = messages
        self.send = send
        self.id = rt.new_id("resp")
        self.modalities = tuple(params.output_modalities or settings.modalities)
        self.audio = "audio" in self.modalities
        self.in_conversation = (params.conversation or "auto") != "none"
        self.output: list[rt.Item] = []
        self.message: rt.Item | None = None
        self.text = ""
        self.calls: dict[int, _Call] = {}
        self.sentences = Sentences()
        self.speaker: Speaker | None = None
        self.usage: chat.Usage | None = None
        self.finish_reason = ""
        self.failure: tuple[str, int] | None = None
        self.cancelled = ""  # why: "client_cancelled" or "turn_detected"
        self.task: asyncio.Task[None] | None = None
        self.speech_ended = speech_ended  # when the turn this answers ended (server VAD), for the metric

    # ---- the task ---------------------------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def cancel(self, reason: str) -> None:
        """Stop now, with `reason`; returns once response.done went out."""
        if self.task is None or self.task.done():
            return
        self.cancelled = reason
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def interrupted(self) -> None:
        """The user spoke: a response in progress is cancelled (and cut to what was heard); one
        whose audio all went out but is still playing at the client is cut to what was heard so far."""
        if self.task is not None and not self.task.done():
            await self.cancel("turn_detected")
            return
        speaker, m = self.speaker, self.message
        if speaker is None or m is None or not m.content or not self.in_conversation:
            return
        heard = speaker.heard_ms()
        if heard >= speaker.sent_ms - 50 or m.content[0].transcript is None:
            return  # played to its end
        m.content[0].transcript = speaker.heard_text(heard)
        m.status = "incomplete"
        await self.send(rt.ConversationItemTruncated(item_id=m.id or "", content_index=0, audio_end_ms=heard))

    async def _run(self) -> None:
        await self.send(rt.ResponseCreated(response=self._response("in_progress")))
        try:
            await self._answer()
        except asyncio.CancelledError:
            if not self.cancelled:
                raise  # the session is closing: nobody is there to tell
        except GenieXError as exc:
            self.failure = (exc.message, exc.status)
        except Exception:  # a bug: the response fails, saying so, and the session goes on
            log.exception("realtime response failed", response_id=self.id)
            self.failure = ("the server failed on this response (its log has why)", 500)
        finally:
            if self.speaker is not None and (self.cancelled or self.failure or not self.speaker.task.done()):
                await self.speaker.stop()
        await self._close()

    async def _answer(self) -> None:
        s, services = self.session, self.session.services
        settings = self.settings
        messages = [*([chat.ChatMessage(role="system", content=i)] if (i := self.params.instructions
                                                                       if self.params.instructions is not None
                                                                       else settings.instructions) else []),
                    *(await self.messages())]  # fmt: skip
        tools = self.params.tools if self.params.tools is not None else list(settings.tools)
        limit = (
            self.params.max_output_tokens if self.params.max_output_tokens is not None else settings.max_output_tokens
        )
        req = chat.ChatRequest(
            model=settings.chat_model, messages=messages, stream=True,
            tools=[chat.Tool(function=chat.FunctionDef(name=t.name, description=t.description,
                                                       parameters=t.parameters)) for t in tools] or None,
            tool_choice=_chat_choice(self.params.tool_choice or settings.tool_choice) if tools else None,
            max_completion_tokens=None if limit == "inf" else limit, temperature=settings.temperature,
        )  # fmt: skip
        entry = services.store.resolve(settings.chat_model)
        plan = plan_chat(req, s.log_id, services.store, services.settings.grammar_dirs, tenant=s.tenant,
                         truncation=services.settings.truncation)  # fmt: skip
        c = relay.Completion(entry.id, services.accounting(entry.id, s.caller, None), id_prefix="resp")
        worker = await c.guard(
            services.worker(entry, prompt_chars=prompt_chars(req.messages, plan.generate.truncation))
        )
        shaper = ChoiceShaper(0, plan.shape, worker.ready_info.tool_format if worker.ready_info else "")
        rest = c.run_on(worker, plan.generations())
        first = await c.guard(anext(rest))
        async for ev in dialect_stream.drive(c, shaper, _Events(self), first, rest, _same):
            await self.send(ev)
        if self.failure is None:
            tail = self.sentences.rest()
            if tail and self.audio:
                self._voice().say(tail)
            if self.speaker is not None:
                await self.speaker.finish()

    # ---- the model's pieces, as events --------------------------------------------------------

    def say(self, text: str) -> list[rt.ServerEvent]:
        events: list[rt.ServerEvent] = []
        if self.message is None:
            events += self._open_message()
        self.text += text
        if not self.audio:
            return [*events, self._in_part(rt.OutputTextDelta, delta=text)]
        for sentence in self.sentences.feed(text):
            self._voice().say(sentence)
        return [*events, self._in_part(rt.OutputAudioTranscriptDelta, delta=text)]

    def _in_part(self, kind: type[P], **fields: Any) -> P:
        """An event of the answer's one content part."""
        assert self.message is not None
        return kind(response_id=self.id, item_id=self.message.id or "", output_index=self.output.index(self.message),
                    content_index=0, **fields)  # fmt: skip

    def _voice(self) -> Speaker:
        if self.speaker is None:
            s = self.session
            settings = self.settings

            async def delta(audio: str) -> None:
                if self.speech_ended is not None:
                    s.services.metrics.realtime_first_audio.observe(time.monotonic() - self.speech_ended)
                    self.speech_ended = None
                await self.send(self._in_part(rt.OutputAudioDelta, delta=audio))

            accounting = s.services.accounting(settings.voice_model, s.caller, None)
            self.speaker = Speaker(s.services, settings.voice_model, settings.voice, settings.speed, s.log_id,
                                   accounting, delta)  # fmt: skip
        return self.speaker

    def _open_message(self) -> list[rt.ServerEvent]:
        part = rt.ContentPart(type="output_audio" if self.audio else "output_text")
        self.message = rt.Item(type="message", id=rt.new_id("item"), role="assistant", status="in_progress",
                               content=[part])  # fmt: skip
        self.output.append(self.message)
        index = len(self.output) - 1
        out: list[rt.ServerEvent] = [rt.OutputItemAdded(response_id=self.id, output_index=index, item=self.message)]
        if self.in_conversation:
            out.append(rt.ConversationItemAdded(item=self.message, previous_item_id=self.session.last_item_id()))
            self.session.add_item(self.message)
        out.append(rt.ContentPartAdded(response_id=self.id, item_id=self.message.id or "", output_index=index,
                                       content_index=0, part=rt.Part(type="audio" if self.audio else "text",
                                                                     **({"transcript": ""} if self.audio else {"text": ""}))))  # fmt: skip
        return out

    def call_piece(self, piece: ChunkToolCall) -> list[rt.ServerEvent]:
        events: list[rt.ServerEvent] = []
        call = self.calls.get(piece.index)
        if call is None:
            item = rt.Item(type="function_call", id=rt.new_id("item"), call_id=piece.id or rt.new_id("call"),
                           name=piece.function.name or "", arguments="", status="in_progress")  # fmt: skip
            self.output.append(item)
            call = self.calls[piece.index] = _Call(item, len(self.output) - 1)
            events.append(rt.OutputItemAdded(response_id=self.id, output_index=call.index, item=item))
            if self.in_conversation:
                events.append(rt.ConversationItemAdded(item=item, previous_item_id=self.session.last_item_id()))
                self.session.add_item(item)
        elif piece.function.name:
            call.item.name = piece.function.name
        if piece.function.arguments:
            call.arguments += piece.function.arguments
            events.append(rt.FunctionCallArgumentsDelta(response_id=self.id, item_id=call.item.id or "",
                                                        output_index=call.index, call_id=call.item.call_id or "",
                                                        delta=piece.function.arguments))  # fmt: skip
        return events

    # ---- the end --------------------------------------------------------------------------------

    async def _close(self) -> None:
        status = "cancelled" if self.cancelled else "failed" if self.failure else \
            "incomplete" if self.finish_reason == "length" else "completed"  # fmt: skip
        item_status: Literal["completed", "incomplete"] = "completed" if status == "completed" else "incomplete"
        if self.message is not None:
            await self._close_message(item_status)
        for call in self.calls.values():
            call.item.arguments, call.item.status = call.arguments or "{}", item_status
            await self.send(rt.FunctionCallArgumentsDone(response_id=self.id, item_id=call.item.id or "",
                                                         output_index=call.index, call_id=call.item.call_id or "",
                                                         name=call.item.name or "", arguments=call.item.arguments))  # fmt: skip
            await self.send(rt.OutputItemDone(response_id=self.id, output_index=call.index, item=call.item))
            if self.in_conversation:
                await self.send(rt.ConversationItemDone(item=call.item))
        await self.send(rt.ResponseDone(response=self._response(status)))
        log.info("realtime response", response_id=self.id, status=status, reason=self.cancelled or self.finish_reason,
                 calls=len(self.calls), audio_ms=round(self.speaker.sent_ms) if self.speaker else 0)  # fmt: skip

    async def _close_message(self, item_status: Literal["completed", "incomplete"]) -> None:
        m = self.message
        assert m is not None and m.content is not None
        text = self.text
        if self.audio:
            if self.cancelled and self.speaker is not None:
                heard = self.speaker.heard_ms()
                text = self.speaker.heard_text(heard)
                if self.in_conversation:
                    await self.send(
                        rt.ConversationItemTruncated(item_id=m.id or "", content_index=0, audio_end_ms=heard)
                    )
            m.content[0].transcript = text
            await self.send(self._in_part(rt.OutputAudioDone))
            await self.send(self._in_part(rt.OutputAudioTranscriptDone, transcript=text))
            part = rt.Part(type="audio", transcript=text)
        else:
            m.content[0].text = text
            await self.send(self._in_part(rt.OutputTextDone, text=text))
            part = rt.Part(type="text", text=text)
        m.status = item_status
        await self.send(self._in_part(rt.ContentPartDone, part=part))
        await self.send(rt.OutputItemDone(response_id=self.id, output_index=self.output.index(m), item=m))
        if self.in_conversation:
            await self.send(rt.ConversationItemDone(item=m))

    def _response(self, status: str) -> rt.Response:
        details = None
        if status == "cancelled":
            details = rt.StatusDetails(type="cancelled", reason=self.cancelled)
        elif status == "failed" and self.failure is not None:
            details = rt.StatusDetails(type="failed", error=rt.ErrorDetail(
                type="server_error" if self.failure[1] >= 500 else "invalid_request_error", message=self.failure[0]))  # fmt: skip
        elif status == "incomplete":
            details = rt.StatusDetails(type="incomplete", reason="max_output_tokens")
        usage = None
        if self.usage is not None or status != "in_progress":
            u = self.usage or chat.Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
            cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
            usage = rt.ResponseUsage(total_tokens=u.total_tokens, input_tokens=u.prompt_tokens,
                                     output_tokens=u.completion_tokens,
                                     input_token_details=rt.InputTokenDetails(text_tokens=u.prompt_tokens, cached_tokens=cached),
                                     output_token_details=rt.OutputTokenDetails(text_tokens=u.completion_tokens))  # fmt: skip
        return rt.Response(id=self.id, status=status, output=list(self.output), output_modalities=list(self.modalities),  # type: ignore[arg-type]
                           conversation_id=self.session.conversation_id if self.in_conversation else None,
                           status_details=details, usage=usage, metadata=self.params.metadata)  # fmt: skip


def _chat_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """Realtime's (and Responses') forced call, `{"type": "function", "name": ...}`, in chat's shape."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


class _Events:
    """dialect_stream's Renderer: the answer's pieces as this response's events."""

    def __init__(self, run: ResponseRun) -> None:
        self.run = run

    def start(self, prompt_tokens: int, cached_tokens: int) -> list[rt.ServerEvent]:
        return []

    def text(self, text: str) -> list[rt.ServerEvent]:
        return self.run.say(text)

    def piece(self, delta: ChunkDelta, n_tokens: int) -> list[rt.ServerEvent]:
        events = self.run.say(delta.content) if delta.content else []
        for call in delta.tool_calls or []:
            events += self.run.call_piece(call)
        return events

    def close(self) -> list[rt.ServerEvent]:
        return []

    def end(self, finish_reason: str, done: Done, usage: chat.Usage) -> list[rt.ServerEvent]:
        self.run.finish_reason, self.run.usage = finish_reason, usage
        return []

    def fail(self, message: str, status: int, started: bool) -> list[rt.ServerEvent]:
        self.run.failure = (message, status)
        return []


def _same(ev: msgspec.Struct) -> rt.ServerEvent:
    assert isinstance(ev, rt.ServerEvent)
    return ev
