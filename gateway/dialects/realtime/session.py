"""One `/v1/realtime` session: the client's events in, the server's out, over one WebSocket.

Audio appended to the input buffer goes, with server VAD, to the VAD worker as it comes (its state
travels with each request: gateway/dialects/realtime/turns.py reads the probabilities); a turn that ends is
committed as a user item, transcribed by Whisper (its text streamed as it is decoded), and, as
`create_response` says, answered (gateway/dialects/realtime/response.py). Speech that starts while a
response plays cancels it (barge-in). Without VAD the client commits and asks for responses.

Nothing a client sends ends the session or reaches another: a malformed, oversized, unknown or
out-of-order event is an `error` event naming it, and the session goes on. What ends one is the
client leaving (every request of its on the workers is cancelled), its idle or whole-session
bound, or the server stopping.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import msgspec
import structlog

from gateway.dialects.realtime.config import RealtimeProblem, SessionSettings, updated
from gateway.dialects.realtime.response import ResponseRun
from gateway.dialects.realtime.turns import Turn, TurnTaker
from gateway.errors import GenieXError
from gateway.http.services import Services
from gateway.media.wav import wav
from protocol import chat
from protocol import realtime as rt
from protocol.wire import DetectSpeech, SpeechProbs, Transcribe, Transcript, TranscriptPart

log = structlog.get_logger("gateway.realtime")

BYTES_PER_MS = rt.PCM_RATE * 2 // 1000
MAX_APPEND_MS = 15_000  # one append's audio (OpenAI's clients send 20 to 100 ms at a time)
MAX_BUFFER_MS = 120_000  # one uncommitted turn; server VAD ends a longer one there
MIN_COMMIT_MS = 100  # OpenAI's least committable audio
MAX_ITEMS = 512  # the conversation keeps its latest items (the chat's truncation bounds what the model reads)
MAX_VAD_BATCH_MS = 2_000  # audio sent to the VAD worker at once, when it fell behind
# Audio waiting for the VAD worker: a client sending faster than it is analysed is refused past this.
MAX_VAD_BACKLOG_MS = 30_000
TRAILING_MS = 200  # audio kept after the end of speech, so Whisper hears the word's end
CLOSE_RETRY_S = 1.0  # a task that outlived its cancellation is cancelled again after this


class RealtimeSession:
    def __init__(self, services: Services, settings: SessionSettings, send_text: Callable[[str], Awaitable[None]],
                 caller: str, tenant: str, log_id: str) -> None:  # fmt: skip
        self.services = services
        self.settings = settings
        self._send_text = send_text
        self.caller = caller
        self.tenant = tenant
        self.log_id = log_id
        self.conversation_id = rt.new_id("conv")
        self.items: OrderedDict[str, rt.Item] = OrderedDict()
        self.transcripts: dict[str, asyncio.Task[str]] = {}  # a user audio item's transcription
        self.pcm = bytearray()  # the input buffer: audio since `buffer_ms` of the stream
        self.buffer_ms = 0
        self.stream_ms = 0  # audio appended in the whole session
        self.turns = TurnTaker()
        self.vad_on = False  # server VAD reads the appended audio
        self.vad_fresh = False  # its stream starts again with the next audio
        self.speech_item: str | None = None  # the item id speech_started announced
        self.speech_start_ms = 0
        self.vad_audio: asyncio.Queue[bytes] = asyncio.Queue()
        self.vad_task: asyncio.Task[None] | None = None
        self.vad_ms = 0  # audio the VAD worker read, billed as its "prompt" once the session ends
        self.vad_backlog = 0  # bytes appended, not yet read by the VAD worker
        self.closing = False
        self.max_audio_ms = int(services.settings.realtime_max_session_s * 1000)
        self.response: ResponseRun | None = None
        self.tasks: set[asyncio.Task[object]] = set()
        self._lock = asyncio.Lock()
        self.last_active = time.monotonic()
        self._log_substitutions(())
        self._sync_vad()

    # ---- sending --------------------------------------------------------------------------------

    async def send(self, ev: rt.ServerEvent) -> None:
        data = msgspec.json.encode(ev).decode()
        async with self._lock:  # one frame at a time, from the responses and the VAD alike
            await self._send_text(data)

    async def problem(self, p: RealtimeProblem, event_id: str | None = None) -> None:
        detail = msgspec.structs.replace(p.detail, event_id=event_id) if event_id else p.detail
        log.info("realtime event refused", code=detail.code, param=detail.param, error=detail.message[:200])
        await self.send(rt.Error(error=detail))

    def _log_substitutions(self, before: tuple[rt.Substitution, ...]) -> None:
        """Each setting served otherwise than asked, said once when it starts to hold (as the
        session.created or session.updated that carries it says it to the client)."""
        for note in self.settings.substitutions:
            if note not in before:
                log.info("realtime setting served otherwise", param=note.param, served=note.message)

    def spawn(self, work: Awaitable[object]) -> asyncio.Task[object]:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # ---- the conversation ---------------------------------------------------------------------

    def last_item_id(self) -> str | None:
        return next(reversed(self.items), None)

    def add_item(self, item: rt.Item) -> None:
        assert item.id is not None
        self.items[item.id] = item
        while len(self.items) > MAX_ITEMS:
            old, _ = self.items.popitem(last=False)
            self.transcripts.pop(old, None)

    async def chat_messages(self) -> list[chat.ChatMessage]:
        """The conversation as chat messages, once every user turn's transcript is known."""
        pending = [t for t in self.transcripts.values() if not t.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        out: list[chat.ChatMessage] = []
        for item in list(self.items.values()):
            if item.type == "function_call":
                call = chat.ToolCall(
                    id=item.call_id or "", function=chat.FunctionCall(item.name or "", item.arguments or "{}")
                )
                if out and out[-1].role == "assistant" and out[-1].tool_calls is not None and not out[-1].content:
                    out[-1].tool_calls.append(call)
                else:
                    out.append(chat.ChatMessage(role="assistant", tool_calls=[call]))
            elif item.type == "function_call_output":
                out.append(chat.ChatMessage(role="tool", tool_call_id=item.call_id or "", content=item.output or ""))
            else:
                text = " ".join(t for p in item.content or [] if (t := p.text or p.transcript or ""))
                if text.strip():
                    out.append(chat.ChatMessage(role=item.role or "user", content=text))
        return out

    # ---- the client's events --------------------------------------------------------------------

    async def handle(self, raw: str | bytes) -> None:
        self.last_active = time.monotonic()
        event_id = None
        try:
            if isinstance(raw, bytes):
                raise RealtimeProblem("events are JSON text frames; audio goes base64 in `input_audio_buffer.append`",
                                      "invalid_event")  # fmt: skip
            ev = _decode(raw)
            event_id = ev.event_id
            await self._dispatch(ev)
        except RealtimeProblem as p:
            await self.problem(p, event_id)
        except Exception:  # a bug here must not end the session, nor pass in silence
            log.exception("realtime event failed", event_id=event_id)
            await self.problem(RealtimeProblem("the server failed on this event (its log has why)", "server_error",
                                               kind="server_error"), event_id)  # fmt: skip

    async def _dispatch(self, ev: rt.ClientEvent) -> None:
        if isinstance(ev, rt.InputAudioBufferAppend):
            self.append(ev.audio)
        elif isinstance(ev, rt.SessionUpdate):
            before = self.settings.substitutions
            self.settings = updated(self.services, self.settings, ev.session)
            self._log_substitutions(before)
            self._sync_vad()
            await self.send(rt.SessionUpdated(session=self.settings.session()))
        elif isinstance(ev, rt.InputAudioBufferCommit):
            if len(self.pcm) < MIN_COMMIT_MS * BYTES_PER_MS:
                raise RealtimeProblem(f"the input audio buffer holds {len(self.pcm) // BYTES_PER_MS} ms of audio; a "
                                      f"commit needs at least {MIN_COMMIT_MS} ms", "input_audio_buffer_commit_empty")  # fmt: skip
            await self._commit(self.speech_item or rt.new_id("item"), self.buffer_ms, self.stream_ms)
        elif isinstance(ev, rt.InputAudioBufferClear):
            self.pcm.clear()
            self.buffer_ms = self.stream_ms
            await self.send(rt.Cleared())
        elif isinstance(ev, rt.OutputAudioBufferClear):
            raise RealtimeProblem("`output_audio_buffer.clear` is for WebRTC sessions; over a WebSocket send "
                                  "`response.cancel` (and `conversation.item.truncate`)", "unsupported_event")  # fmt: skip
        elif isinstance(ev, rt.ConversationItemCreate):
            await self._create_item(ev.item, ev.previous_item_id)
        elif isinstance(ev, rt.ConversationItemDelete):
            if self.items.pop(self._known(ev.item_id), None) is not None:
                await self.send(rt.ConversationItemDeleted(item_id=ev.item_id))
        elif isinstance(ev, rt.ConversationItemRetrieve):
            await self.send(rt.ConversationItemRetrieved(item=self.items[self._known(ev.item_id)]))
        elif isinstance(ev, rt.ConversationItemTruncate):
            await self._truncate(ev)
        elif isinstance(ev, rt.ResponseCreate):
            await self.respond(ev.response or rt.ResponseParams())
        elif isinstance(ev, rt.ResponseCancel):
            run = self.response
            if run is None or run.task is None or run.task.done() or (ev.response_id and ev.response_id != run.id):
                raise RealtimeProblem("no response is in progress" + (f" with id {ev.response_id!r}" if ev.response_id else ""),
                                      "response_cancel_not_active")  # fmt: skip
            await run.cancel("client_cancelled")

    def _known(self, item_id: str) -> str:
        if item_id not in self.items:
            raise RealtimeProblem(f"no item {item_id!r} in this conversation", "item_not_found", "item_id")
        return item_id

    # ---- input audio ------------------------------------------------------------------------------

    def append(self, audio: str) -> None:
        if len(audio) > (MAX_APPEND_MS * BYTES_PER_MS * 4) // 3 + 4:
            raise RealtimeProblem(f"`audio`: one append takes at most {MAX_APPEND_MS // 1000} s of audio "
                                  f"({MAX_APPEND_MS * BYTES_PER_MS} bytes of 24 kHz 16-bit PCM); send it in pieces",
                                  "audio_too_large", "audio")  # fmt: skip
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise RealtimeProblem("`audio` is not base64", "invalid_audio", "audio") from None
        if len(pcm) % 2:
            raise RealtimeProblem("`audio` must be whole 16-bit samples (24 kHz mono PCM): it has an odd byte count",
                                  "invalid_audio", "audio")  # fmt: skip
        if not pcm:
            return
        vad = self.settings.turn_detection is not None
        if self.stream_ms + len(pcm) // BYTES_PER_MS > self.max_audio_ms:
            raise RealtimeProblem(f"this session has taken its {self.max_audio_ms // 1000} s of audio (as much as it "
                                  "may last); open another", "session_audio_exhausted")  # fmt: skip
        if vad and self.vad_backlog + len(pcm) > MAX_VAD_BACKLOG_MS * BYTES_PER_MS:
            raise RealtimeProblem(f"audio arrives faster than voice activity detection reads it ({MAX_VAD_BACKLOG_MS // 1000} "
                                  "s wait already); send it at about real time", "audio_backlog")  # fmt: skip
        if not vad and len(self.pcm) + len(pcm) > MAX_BUFFER_MS * BYTES_PER_MS:
            raise RealtimeProblem(f"the input audio buffer is full ({MAX_BUFFER_MS // 1000} s): commit or clear it",
                                  "input_audio_buffer_full")  # fmt: skip
        self.pcm += pcm
        self.stream_ms += len(pcm) // BYTES_PER_MS
        if vad:
            self.vad_backlog += len(pcm)
            self.vad_audio.put_nowait(pcm)

    def _sync_vad(self) -> None:
        t = self.settings.turn_detection
        if t is None:
            self.vad_on = self.turns.speaking = False
            return
        if not self.vad_on:  # (again): a new VAD stream from here, its windows counted from the audio so far
            self.turns = TurnTaker(position_ms=self.stream_ms)
            self.vad_fresh = True
        self.vad_on = True
        self.turns.threshold, self.turns.silence_duration_ms = t.threshold, t.silence_duration_ms
        if self.vad_task is None or self.vad_task.done():
            self.vad_task = asyncio.create_task(self._vad_loop())

    async def _vad_loop(self) -> None:
        state = b""
        worker = None
        while True:
            pcm = await self.vad_audio.get()
            if self.closing:
                return
            while not self.vad_audio.empty() and len(pcm) < MAX_VAD_BATCH_MS * BYTES_PER_MS:
                pcm += self.vad_audio.get_nowait()
            self.vad_backlog -= len(pcm)
            if not self.vad_on:
                continue
            if self.vad_fresh:
                state, self.vad_fresh = b"", False
            try:
                if worker is None or not worker.alive:
                    worker = await self.services.worker(self.services.store.resolve(self.settings.vad_model))
                reply = await worker.call(DetectSpeech(0, self.log_id, pcm, rt.PCM_RATE, state))
            except GenieXError as exc:
                state, worker = b"", None
                await self.problem(RealtimeProblem(f"voice activity detection failed: {exc.message}", "vad_failed",
                                                   kind="server_error"))  # fmt: skip
                continue
            assert isinstance(reply, SpeechProbs)
            state = reply.state
            self.vad_ms += len(pcm) // BYTES_PER_MS
            for turn in self.turns.feed(reply.probs):
                await self._turn(turn)
            if (
                self.turns.speaking
                and self.stream_ms - self.speech_start_ms > MAX_BUFFER_MS
                and (cut := self.turns.cut())
            ):
                await self._turn(cut)
            if not self.turns.speaking:
                self._trim()

    def _trim(self) -> None:
        """Between turns, keep only the audio a next turn's prefix padding may need."""
        t = self.settings.turn_detection
        keep_from = self.turns.position_ms - (t.prefix_padding_ms if t else 0) - 100
        drop = (keep_from - self.buffer_ms) * BYTES_PER_MS
        if drop > 0:
            del self.pcm[:drop]
            self.buffer_ms += drop // BYTES_PER_MS

    async def _turn(self, turn: Turn) -> None:
        t = self.settings.turn_detection
        assert t is not None
        if turn.kind == "started":
            self.speech_item, self.speech_start_ms = rt.new_id("item"), turn.ms
            await self.send(rt.SpeechStarted(audio_start_ms=turn.ms, item_id=self.speech_item))
            if t.interrupt_response and self.response is not None:
                await self.response.interrupted()  # barge-in
            return
        item_id = self.speech_item or rt.new_id("item")
        self.speech_item = None
        await self.send(rt.SpeechStopped(audio_end_ms=turn.ms, item_id=item_id))
        start = max(self.buffer_ms, self.speech_start_ms - t.prefix_padding_ms)
        await self._commit(item_id, start, min(self.stream_ms, turn.ms + TRAILING_MS))
        if t.create_response and not self.settings.transcribing:
            self.spawn(self._respond_when_free(item_id, time.monotonic()))

    async def _respond_when_free(self, item_id: str, speech_ended: float) -> None:
        """Answer the turn once its words are known (a turn Whisper heard nothing in is not
        answered) and any response still in progress has ended."""
        heard = self.transcripts.get(item_id)
        if heard is not None and not (await asyncio.gather(heard, return_exceptions=True))[0]:
            return
        while self.response is not None and self.response.task is not None and not self.response.task.done():
            await asyncio.gather(self.response.task, return_exceptions=True)
        try:
            await self.respond(rt.ResponseParams(), speech_ended)
        except RealtimeProblem as p:
            await self.problem(p)

    async def _commit(self, item_id: str, start_ms: int, end_ms: int) -> None:
        a, b = (start_ms - self.buffer_ms) * BYTES_PER_MS, (end_ms - self.buffer_ms) * BYTES_PER_MS
        audio = bytes(self.pcm[max(0, a) : max(0, b)])
        del self.pcm[: max(0, b)]
        self.buffer_ms = max(self.buffer_ms, end_ms)
        previous = self.last_item_id()
        item = rt.Item(type="message", id=item_id, role="user", status="completed",
                       content=[rt.ContentPart(type="input_audio", transcript=None)])  # fmt: skip
        self.add_item(item)
        await self.send(rt.Committed(item_id=item_id, previous_item_id=previous))
        await self.send(rt.ConversationItemAdded(item=item, previous_item_id=previous))
        self.transcripts[item_id] = asyncio.create_task(self._transcribe(item, audio, previous))

    async def _transcribe(self, item: rt.Item, pcm: bytes, previous: str | None) -> str:
        """The user's words in `pcm`, streamed as they are decoded when the client asked for
        transcription events; "" (and a failed event) when Whisper cannot tell."""
        s, item_id = self.settings, item.id or ""
        tell = s.transcription is not None
        accounting = self.services.accounting(s.transcriber, self.caller, None)
        text = ""
        try:
            worker = await accounting.guard(self.services.worker(self.services.store.resolve(s.transcriber)))
            stream = worker.transcribe(Transcribe(0, self.log_id, wav(pcm, rt.PCM_RATE), s.language, s.prompt))
            async for msg in stream:
                if isinstance(msg, TranscriptPart):
                    if tell and msg.segment.text.strip():
                        await self.send(rt.TranscriptionDelta(item_id=item_id, content_index=0, delta=msg.segment.text))
                    text += msg.segment.text
                elif isinstance(msg, Transcript):
                    text = "".join(seg.text for seg in msg.segments).strip()
                    accounting.settle("ok", max(1, round(msg.duration)), sum(len(seg.tokens) for seg in msg.segments))
                    if tell:
                        await self.send(rt.TranscriptionCompleted(item_id=item_id, content_index=0, transcript=text,
                                                                  usage=rt.DurationUsage(seconds=round(msg.duration, 3))))  # fmt: skip
        except GenieXError as exc:
            accounting.settle("error", 0, 0)
            if tell:
                await self.send(rt.TranscriptionFailed(item_id=item_id, content_index=0, error=rt.ErrorDetail(
                    type="transcription_error", message=exc.message, code="transcription_failed")))  # fmt: skip
        if item.content:
            item.content[0].transcript = text
        if item_id in self.items:
            await self.send(rt.ConversationItemDone(item=item, previous_item_id=previous))
        return text

    async def _create_item(self, item: rt.Item, previous_item_id: str | None) -> None:
        if self.settings.transcribing:
            raise RealtimeProblem("a transcription session has no conversation to add items to", "invalid_event")
        if previous_item_id not in (None, "root") and previous_item_id not in self.items:
            raise RealtimeProblem(f"`previous_item_id`: no item {previous_item_id!r} in this conversation",
                                  "item_not_found", "previous_item_id")  # fmt: skip
        if item.id is not None and item.id in self.items:
            raise RealtimeProblem(f"`item.id`: an item {item.id!r} is already in this conversation", "duplicate_item_id",
                                  "item.id")  # fmt: skip
        if item.type == "message" and (item.role is None or not item.content):
            raise RealtimeProblem("`item`: a message needs a `role` and `content`", "invalid_value", "item")
        if item.type == "function_call_output" and not item.call_id:
            raise RealtimeProblem("`item.call_id`: a function_call_output answers a call by its `call_id`",
                                  "invalid_value", "item.call_id")  # fmt: skip
        if item.type == "function_call" and not (item.name and item.call_id):
            raise RealtimeProblem("`item`: a function_call needs a `name` and a `call_id`", "invalid_value", "item")
        audio = [p for p in item.content or [] if p.type == "input_audio"]
        if len(audio) > 1:
            raise RealtimeProblem("`item.content`: at most one `input_audio` part per message", "invalid_value",
                                  "item.content")  # fmt: skip
        pcm = b""
        if audio and audio[0].audio:
            if len(audio[0].audio) > (MAX_BUFFER_MS * BYTES_PER_MS * 4) // 3 + 4:
                raise RealtimeProblem(f"`item.content`: an audio part holds at most {MAX_BUFFER_MS // 1000} s of audio",
                                      "audio_too_large", "item.content")  # fmt: skip
            try:
                pcm = base64.b64decode(audio[0].audio, validate=True)
            except (binascii.Error, ValueError):
                raise RealtimeProblem(
                    "`item.content`: its `audio` is not base64", "invalid_audio", "item.content"
                ) from None
            audio[0].audio = None  # never echoed back
        previous = self.last_item_id()
        item = msgspec.structs.replace(item, id=item.id or rt.new_id("item"), status=item.status or "completed")
        self.add_item(item)
        await self.send(rt.ConversationItemAdded(item=item, previous_item_id=previous))
        if pcm:
            self.transcripts[item.id or ""] = asyncio.create_task(self._transcribe(item, pcm, previous))
        else:
            await self.send(rt.ConversationItemDone(item=item, previous_item_id=previous))

    async def _truncate(self, ev: rt.ConversationItemTruncate) -> None:
        item = self.items[self._known(ev.item_id)]
        if item.role != "assistant" or not item.content or ev.content_index >= len(item.content) \
                or item.content[ev.content_index].type != "output_audio":  # fmt: skip
            raise RealtimeProblem("only an assistant message's audio part can be truncated", "invalid_value", "item_id")
        run = self.response
        part = item.content[ev.content_index]
        if run is not None and run.message is item and run.speaker is not None:
            if ev.audio_end_ms > run.speaker.sent_ms + 1:
                raise RealtimeProblem(f"`audio_end_ms` {ev.audio_end_ms} is past the audio sent "
                                      f"({int(run.speaker.sent_ms)} ms)", "invalid_value", "audio_end_ms")  # fmt: skip
            part.transcript = run.speaker.heard_text(ev.audio_end_ms)
        await self.send(rt.ConversationItemTruncated(item_id=ev.item_id, content_index=ev.content_index,
                                                     audio_end_ms=ev.audio_end_ms))  # fmt: skip

    # ---- responses --------------------------------------------------------------------------------

    async def respond(self, params: rt.ResponseParams, speech_ended: float | None = None) -> None:
        """Start a response (`speech_ended`: when the turn it answers ended, for the latency metric)."""
        if self.settings.transcribing:
            raise RealtimeProblem("a transcription session makes no responses", "invalid_event")
        if self.response is not None and self.response.task is not None and not self.response.task.done():
            raise RealtimeProblem(f"a response ({self.response.id}) is in progress; wait for its response.done or "
                                  "cancel it", "conversation_already_has_active_response")  # fmt: skip
        messages = self.chat_messages
        if params.input is not None:
            items = params.input

            async def messages() -> list[chat.ChatMessage]:
                return [chat.ChatMessage(role=i.role or "user", content=" ".join(p.text or p.transcript or ""
                                                                                 for p in i.content or []))
                        for i in items if i.type == "message"]  # fmt: skip

        self.response = ResponseRun(self, self.settings, params, messages, self.send, speech_ended)
        self.response.start()

    # ---- the end --------------------------------------------------------------------------------

    async def close(self) -> None:
        """Cancel everything still running for this session (on the workers too)."""
        self.closing = True
        self.vad_audio.put_nowait(b"")  # wakes the VAD loop, should a cancellation be lost on the way
        tasks = [t for t in (self.vad_task, self.response.task if self.response else None, *self.tasks,
                             *self.transcripts.values()) if t is not None and not t.done()]  # fmt: skip
        while tasks:
            for t in tasks:
                t.cancel()
            _, left = await asyncio.wait(tasks, timeout=CLOSE_RETRY_S)
            tasks = list(left)
        if self.vad_ms and self.settings.vad_model:
            self.services.accounting(self.settings.vad_model, self.caller, None).settle(
                "ok", max(1, self.vad_ms // 1000), 0
            )


_decoder = msgspec.json.Decoder(rt.ClientEvents)


def _decode(raw: str) -> rt.ClientEvent:
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        kind = _kind(raw)
        if kind is not None and kind not in rt.CLIENT_EVENT_TYPES:
            raise RealtimeProblem(f"unknown event type {kind[:64]!r}", "invalid_event", "type") from None
        raise RealtimeProblem(f"invalid event: {exc}", "invalid_value", _path(str(exc))) from None
    except msgspec.DecodeError:
        raise RealtimeProblem("the event is not a JSON object", "invalid_json") from None
    except RecursionError:  # as gateway/http/body.py's read_json: Python's limit bounds msgspec's nesting
        raise RealtimeProblem("the event nests too deeply", "invalid_json") from None


def _kind(raw: str) -> str | None:
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        kind = msgspec.json.decode(raw, type=dict[str, object]).get("type")
        return kind if isinstance(kind, str) else None
    return None


def _path(message: str) -> str | None:
    at = message.rpartition(" - at `$.")[2]
    return at.rstrip("`") if at != message else None
