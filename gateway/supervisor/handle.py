"""The gateway's side of one worker process: its subprocess, its sockets, its requests.

One reader task routes every reply to the per-request queue it belongs to. One watcher task
waits on the process and is the only place that tears a handle down: when the process exits,
asked to or not, every waiting request is woken with the reason at once, so nothing hangs on
a dead worker. The handle never touches the pool: it reports what happens to it (busy, idle,
exited) as events on a queue the pool reads.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import itertools
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import psutil
import structlog
import zmq
import zmq.asyncio

from gateway.errors import (
    GatewayTimeout,
    GenieXError,
    Overloaded,
    WorkerDied,
    WorkerUnavailable,
    error_for,
)
from gateway.supervisor import compute
from gateway.supervisor.claims import Claims
from gateway.supervisor.deadline import within
from gateway.supervisor.events import EventHub
from gateway.supervisor.states import IllegalTransition, State, can_move
from protocol import engines, worker_args
from protocol.events import WorkerChange
from protocol.keys import WorkerKey
from protocol.wire import (
    PROTOCOL_VERSION,
    Audio,
    Beat,
    Cancel,
    CountTokens,
    Delta,
    DetectSpeech,
    Detokenize,
    Diarization,
    Diarize,
    Done,
    Dying,
    Embed,
    Embeddings,
    Failed,
    Generate,
    GenerateImages,
    Images,
    LogitRows,
    Logits,
    Ready,
    Recognize,
    Rerank,
    Scores,
    SetThreads,
    Shutdown,
    Speak,
    SpeechProbs,
    Started,
    Text,
    TextRegions,
    TokenCount,
    Tokenize,
    TokenList,
    ToWorker,
    Transcribe,
    Transcript,
    TranscriptPart,
    UpstreamHealth,
    Warmup,
    gateway_codec,
)
from protocol.worker_args import WorkerArgs

log = structlog.get_logger("gateway.worker")

Streamed = Started | Delta | Done  # what a generation yields
LAST_REPLIES = (Done, Transcript)  # what ends a streamed request (a tuple: checked per token)
# Requests answered with one reply, and those replies.
OneShot = (
    CountTokens
    | Tokenize
    | Detokenize
    | Logits
    | Embed
    | Rerank
    | Recognize
    | Transcribe
    | Diarize
    | GenerateImages
    | DetectSpeech
)
Answer = (
    TokenCount
    | TokenList
    | Text
    | LogitRows
    | Embeddings
    | Scores
    | TextRegions
    | Transcript
    | Diarization
    | Images
    | SpeechProbs
)
# How long a one-shot request may wait for its answer, its place in the worker's queue included:
# a tokenizer answers between two decode steps; embeddings, scores, logits and OCR take seconds
# a batch; an hour of audio or a batch of images on a laptop's CPU can take many minutes. Past it
# the request is cancelled on the worker and is a 504, rather than a client waiting forever on a
# worker that will never answer.
CALL_TIMEOUT_S: dict[type, float] = {
    Tokenize: 60, Detokenize: 60, CountTokens: 120, Logits: 600, Embed: 600, Rerank: 600, Recognize: 600,
    Transcribe: 3600, Diarize: 3600, GenerateImages: 3600, DetectSpeech: 30,
}  # fmt: skip


# How long a worker told to shut down has before SIGTERM.
SHUTDOWN_WAIT_S = 10.0


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a handle needs to start its process; the pool fills it in."""

    key: WorkerKey
    worker: WorkerArgs  # the process's arguments (its endpoints and our pid are added at start)
    load_timeout_s: float
    max_queue: int

    @property
    def engine(self) -> str:
        return self.worker.engine

    def argv(self, inbox: str, outbox: str) -> list[str]:
        # Isolated mode (-I): no PYTHON* variables, no user site-packages, and not the working
        # directory on sys.path, so a stray workers.py or a PYTHONPATH in the service's
        # environment cannot put code into a worker. A bytecode cache set for the gateway
        # (PYTHONPYCACHEPREFIX, as the systemd unit sets it) is passed on explicitly.
        cache = ["-X", f"pycache_prefix={sys.pycache_prefix}"] if sys.pycache_prefix else []
        args = msgspec.structs.replace(self.worker, inbox=inbox, outbox=outbox, parent_pid=os.getpid())
        return [sys.executable, "-I", *cache, "-m", "workers", *worker_args.argv(args)]


class Happened(enum.Enum):
    BUSY = "busy"  # the first request came in
    IDLE = "idle"  # the last request left
    EXITED = "exited"  # the process is gone (`crashed`: it was not asked to go)


class WorkerEvent(NamedTuple):
    handle: WorkerHandle
    what: Happened
    crashed: bool = False


class _Pending:
    """One request in flight: where its replies go, how far it has got, and its request id."""

    __slots__ = ("log_id", "n_tokens", "queue")

    def __init__(self, log_id: str) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.n_tokens = 0
        self.log_id = log_id


def send_in_order(sock: zmq.asyncio.Socket, frame: bytes) -> None:
    """Send `frame` on the PUSH socket to a worker without waiting, in order after any frame still
    waiting. A worker connects its inbox as it starts, and its `Ready` can arrive before that
    connection is made: a frame sent then waits for it (a non-blocking send would be refused, and the
    request it carried would never be answered). A frame still waiting when the worker dies is
    cancelled as its socket closes; the death is reported by the watcher, with its real cause."""
    sent = asyncio.ensure_future(sock.send(frame))  # zmq.asyncio's own Future, returned as it is
    sent.add_done_callback(_sent)


def _sent(f: asyncio.Future[Any]) -> None:
    if not f.cancelled() and (exc := f.exception()) is not None:
        log.warning("a message to a worker was not sent", error=str(exc))


class WorkerHandle:
    def __init__(self, spec: WorkerSpec, zctx: zmq.asyncio.Context, runtime_dir: Path,
                 events: asyncio.Queue[WorkerEvent] | None = None, claims: Claims | None = None,
                 hub: EventHub | None = None) -> None:  # fmt: skip
        self.spec = spec
        self.key = spec.key
        self.state = State.STARTING
        self.ready_info: Ready | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.started_at = time.time()
        self.last_used = time.monotonic()
        self.requests_served = 0
        self.exit_reason: str | None = None
        self.keep_alive: float | None = None  # a request's `keep_alive` overrides --keep-alive-s
        self.drafts: set[str] = set()  # draft models requests had it load (pool.add_draft)
        self.tokens_generated = 0
        self.cache_bytes = 0  # the worker's prompt cache, as its last Started said
        self.cache_evictions = 0
        self.disk: tuple[int, int, int, int] = (0, 0, 0, 0)  # its disk tier: bytes, hits, evictions, write errors
        self.threads: int | None = None  # the last SetThreads sent; None: the worker's own default
        self.upstream_health: UpstreamHealth | None = None  # an upstream worker's last probe of its server
        self._events = events
        self._hub = hub  # where its state changes are published for /v1/events
        self.stop_reason: str | None = None  # why it was asked to stop (the pool says: unload, idle, evicted, ...)
        # Progress (gateway/supervisor/liveness.py): when it last sent anything, and its last heartbeat.
        self.last_heard = time.monotonic()
        self.beat = Beat(0, 0.0)
        self.beat_at = self.last_heard
        self.hung: str | None = None  # why it was found hung, while it is being killed
        self._killing: asyncio.Task[None] | None = None
        self._codec = gateway_codec()
        self._ids = itertools.count(1)
        self._queues: dict[int, _Pending] = {}
        self._claims = claims if claims is not None else Claims()  # the pool's: requests handed this worker
        self._cancelled: dict[int, int] = {}  # req_id -> tokens relayed when the cancel was sent
        self._ready: asyncio.Future[Ready] = asyncio.get_running_loop().create_future()
        self._dying: str | None = None
        self._refusal: str | None = None  # set by abort(): every new request is refused with it
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        slug = spec.key.slug
        self._cwd = runtime_dir  # the gateway's private 0700 folder
        self._inbox = f"ipc://{runtime_dir / slug}.in"
        self._outbox = f"ipc://{runtime_dir / slug}.out"
        self._push = zctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.bind(self._inbox)
        self._pull = zctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(self._outbox)
        self.log = log.bind(worker=slug)

    # ---- state -------------------------------------------------------------

    def _move(self, new: State) -> None:
        if self.state is new:
            return
        if not can_move(self.state, new):
            raise IllegalTransition(f"{self.state.value} -> {new.value}")
        self.log.info("worker state", old=self.state.value, new=new.value, pid=self.pid)
        self.state = new
        if new is State.READY:
            self.publish("ready")
        elif new is State.STOPPING:
            self.publish("stopping", self.stop_reason)
        elif new is State.STOPPED:
            self.publish("evicted" if self.stop_reason == "evicted" else "unloaded", self.stop_reason)
        elif new is State.FAILED:
            self.publish("crashed", self.exit_reason)

    def publish(self, state: str, reason: str | None = None) -> None:
        """Tell /v1/events' subscribers that this worker is now in `state` (protocol/events.py)."""
        if self._hub is not None:
            self._hub.publish(self.change(state, reason))

    def change(self, state: str | None = None, reason: str | None = None, *, snapshot: bool = False) -> WorkerChange:
        """This worker as a /v1/events event: in `state`, or (None) the one it is in now."""
        if state is None:
            state = "loading" if self.state is State.STARTING else self.status
            if self.state is State.STOPPED:
                state = "evicted" if self.stop_reason == "evicted" else "unloaded"
            elif self.state is State.FAILED:
                state = "crashed"
        k = self.key
        return WorkerChange(model=k.model, worker=k.slug, state=state, pid=self.pid, compute=k.compute, nctx=k.nctx,
                            at=time.time(), reason=reason, snapshot=snapshot)  # fmt: skip

    def _report(self, what: Happened, crashed: bool = False) -> None:
        if what is not Happened.EXITED and self.state is State.READY:
            self.publish(what.value)  # busy or idle
        if self._events is not None:
            self._events.put_nowait(WorkerEvent(self, what, crashed))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def engine(self) -> str:
        return self.ready_info.engine if self.ready_info is not None else self.spec.engine

    @property
    def inflight(self) -> int:
        return len(self._queues)

    @property
    def idle(self) -> bool:
        """Ready, with nothing running, queued or about to be sent: a worker the pool may stop."""
        return self.state is State.READY and not self._queues and not self._claims.held(self.key) and self.hung is None

    @property
    def status(self) -> str:
        """The state as operators read it: a ready worker is busy or idle (or hung, while it is killed)."""
        if self.state is State.READY and self.hung is not None:
            return "hung"
        if self.state is State.READY:
            return "busy" if self._queues else "idle"
        return self.state.value

    def rss(self) -> int | None:
        """The worker process's resident memory in bytes (None once it is gone)."""
        try:
            return int(psutil.Process(self.proc.pid).memory_info().rss) if self.proc else None
        except psutil.Error:
            return None

    @property
    def alive(self) -> bool:
        return self.state in (State.STARTING, State.READY)

    # ---- lifecycle ---------------------------------------------------------

    async def start(self) -> Ready:
        s = self.spec
        argv = s.argv(self._inbox, self._outbox)
        self.log.debug("worker command", argv=argv)
        # The worker outlives the request that started it: its tasks log without that request's id.
        fresh = contextvars.Context()
        try:
            # A fixed working directory, the gateway's private one: nothing resolves against where it was started.
            self.proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, cwd=self._cwd)
        except OSError as exc:
            await self.stop(graceful=False, reason="failed to load")
            raise WorkerUnavailable(f"could not start a worker for {s.key.model}: {exc}") from None
        self.log = self.log.bind(pid=self.proc.pid)
        self.log.info("worker spawned", model=s.key.model, engine=s.engine)
        self.publish("loading")
        self._reader = asyncio.create_task(self._read_replies(), name=f"read:{s.key.slug}", context=fresh)
        self._watcher = asyncio.create_task(self._watch(self.proc), name=f"watch:{s.key.slug}", context=fresh)
        try:
            async with asyncio.timeout(s.load_timeout_s):
                ready = await asyncio.shield(self._ready)
        except TimeoutError:
            await self.stop(graceful=False, reason="failed to load")
            raise WorkerUnavailable(
                f"worker for {s.key.model} did not become ready within {s.load_timeout_s:g}s; "
                "raise --load-timeout-s if the model is large, or check the worker's log"
            ) from None
        if ready.protocol_version != PROTOCOL_VERSION:
            await self.stop(graceful=False, reason="failed to load")
            raise WorkerUnavailable(f"worker speaks protocol {ready.protocol_version}, gateway {PROTOCOL_VERSION}")
        self.ready_info = ready
        compute.learn(s.engine, ready)  # what the engine's build can do: the gateway imports no engine to ask
        self._move(State.READY)
        return ready

    async def stop(self, *, graceful: bool = True, timeout: float = 10.0, reason: str | None = None) -> None:
        """Ask the process to go (graceful: after its in-flight requests, up to `timeout`; then
        Shutdown, SIGTERM, SIGKILL) and wait until the watcher has torn the handle down. `reason`:
        why, as /v1/events tells it (unload, idle, evicted, ...)."""
        if self.state in (State.STOPPED, State.FAILED):
            return
        if self.stop_reason is None:
            self.stop_reason = reason
        self._move(State.STOPPING)
        proc = self.proc
        if proc is None or self._watcher is None:  # never spawned
            self._teardown(WorkerDied(f"worker for {self.key.model} was stopped"), crashed=False)
            return
        if proc.returncode is None:
            if graceful:
                deadline = time.monotonic() + timeout
                while self._queues and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                self._send(Shutdown())
            # A chat worker writes its prompt states to disk as it goes (disk_cache.CLOSE_WAIT_S).
            wait = SHUTDOWN_WAIT_S if engines.info(self.spec.engine).prompt_cache else 3.0
            if not graceful or not await _exited(proc, wait):
                proc.send_signal(signal.SIGTERM)
                if not await _exited(proc, 3.0):
                    proc.kill()
        await asyncio.shield(self._watcher)

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if self.state is State.STOPPING:
            self._teardown(WorkerDied(f"worker for {self.key.model} was stopped"), crashed=False)
            return
        reason = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        if self._dying:
            reason += f": {self._dying}"
        self.exit_reason = reason
        self.log.error("worker died", reason=reason, inflight=len(self._queues),
                       requests=[p.log_id for p in self._queues.values()])  # fmt: skip
        self._teardown(WorkerDied(f"worker for {self.key.model} died ({reason})"), crashed=True)

    def _teardown(self, err: GenieXError, *, crashed: bool) -> None:
        """The one way a handle ends: wake everything waiting on it, close up, tell the pool."""
        if not self._ready.done():
            self._ready.set_exception(err)
            self._ready.exception()  # retrieved here; start() raises it
        self._move(State.FAILED if crashed else State.STOPPED)
        for p in self._queues.values():
            p.queue.put_nowait(err)
        self._queues.clear()
        if self._reader is not None:
            self._reader.cancel()  # it closes its socket once the cancellation reaches it
        else:
            self._pull.close(0)
        self._push.close(0)
        self._report(Happened.EXITED, crashed)

    async def _read_replies(self) -> None:
        try:
            await self._route_replies()
        finally:
            self._pull.close(0)

    async def _route_replies(self) -> None:
        decode = self._codec.decode
        while True:
            raw = await self._pull.recv(copy=False)
            msg = decode(raw.buffer)
            self.last_heard = now = time.monotonic()
            if isinstance(msg, Beat):
                self.beat, self.beat_at = msg, now
            elif isinstance(msg, Delta):
                p = self._queues.get(msg.req_id)
                if p is not None:
                    # Counted as they come (n_tokens is the request's running total), so that
                    # /v1/workers shows throughput during long answers, not only when they end.
                    self.tokens_generated += max(0, msg.n_tokens - p.n_tokens)
                    p.n_tokens = msg.n_tokens
                    p.queue.put_nowait(msg)
            elif isinstance(msg, Started):
                self.cache_bytes, self.cache_evictions = msg.cache_bytes, msg.cache_evictions
                self.disk = (msg.disk_bytes, msg.disk_hits, msg.disk_evictions, msg.disk_write_errors)
                p = self._queues.get(msg.req_id)
                if p is not None:
                    p.queue.put_nowait(msg)
            elif isinstance(msg, Audio | TranscriptPart):  # a sentence of speech, a segment of text; more follows
                p = self._queues.get(msg.req_id)
                if p is not None:
                    p.queue.put_nowait(msg)
            elif isinstance(msg, Ready):
                if not self._ready.done():
                    self._ready.set_result(msg)
            elif isinstance(msg, UpstreamHealth):
                if msg.healthy != (self.upstream_health.healthy if self.upstream_health else True):
                    self.log.warning("upstream health changed", url=msg.url, healthy=msg.healthy, detail=msg.detail)
                self.upstream_health = msg
            elif isinstance(msg, Dying):
                self._dying = msg.message
                self.log.error("worker dying", error=msg.message)
            else:  # Done, Failed, or a one-shot answer: the request's last reply
                p = self._queues.pop(msg.req_id, None)
                counted = p.n_tokens if p is not None else self._cancelled.get(msg.req_id, 0)
                if p is not None:
                    p.queue.put_nowait(msg)
                elif isinstance(msg, Done) and msg.req_id in self._cancelled:
                    relayed = self._cancelled.pop(msg.req_id)
                    self.log.info("cancel confirmed", relayed_tokens=relayed, generated_tokens=msg.completion_tokens,
                                  overshoot=max(0, msg.completion_tokens - relayed))  # fmt: skip
                if isinstance(msg, Done):  # what the Deltas did not count: the last tokens, or a cancel's overshoot
                    self.tokens_generated += max(0, msg.completion_tokens - counted)

    # ---- requests ----------------------------------------------------------

    def _send(self, msg: ToWorker) -> None:
        send_in_order(self._push, self._codec.encode(msg))

    def _admit(self, log_id: str) -> tuple[int, _Pending]:
        self._claims.release(self.key)  # the request has reached its worker, whether admitted or refused below
        if self._refusal is not None:
            raise Overloaded(self._refusal, retry_after=5)
        if self.state in (State.STOPPING, State.STOPPED):  # evicted, idle or unloaded: not a fault
            raise Overloaded(f"the worker for {self.key.model} was stopped before this request reached it; retry",
                             retry_after=1)  # fmt: skip
        if self.state is State.FAILED:  # it crashed with others' requests, before this one reached it
            raise Overloaded(f"the worker for {self.key.model} died ({self.exit_reason}) before this request "
                             "reached it; retry", retry_after=1)  # fmt: skip
        if self.state is not State.READY:
            raise WorkerDied(f"worker for {self.key.model} is {self.status}")
        assert self.ready_info is not None
        if len(self._queues) >= self.ready_info.parallel + self.spec.max_queue:
            raise Overloaded(
                f"{self.key.model} is at capacity ({self.ready_info.parallel} running, "
                f"{self.spec.max_queue} queued); retry shortly"
            )
        req_id = next(self._ids)
        became_busy = not self._queues
        pending = self._queues[req_id] = _Pending(log_id)
        if became_busy:
            self._report(Happened.BUSY)
        self.last_used = time.monotonic()
        return req_id, pending

    def _left(self) -> None:
        self.last_used = time.monotonic()
        if not self._queues:
            self._report(Happened.IDLE)

    def set_threads(self, n: int) -> None:
        if n != self.threads:
            self.threads = n
            self._send(SetThreads(n))

    def cancel(self, req_id: int) -> None:
        """Safe to call from a `finally` during cancellation: it never awaits."""
        pending = self._queues.pop(req_id, None)
        if pending is not None:
            if len(self._cancelled) > 1024:  # acknowledgements lost to a dead worker
                self._cancelled.clear()
            self._cancelled[req_id] = pending.n_tokens
            self._send(Cancel(req_id))

    def abort(self, message: str) -> int:
        """End every request waiting on this worker with a 503 (`message`) and cancel it on the
        worker; refuse new ones. Never awaits. Returns how many were waiting."""
        self._refusal = message
        pending = list(self._queues.items())
        for req_id, p in pending:
            self.cancel(req_id)
            p.queue.put_nowait(Overloaded(message, retry_after=5))
        if pending:
            self._left()
        return len(pending)

    def kill_hung(self, why: str) -> None:
        """It made no progress (`why`, gateway/supervisor/liveness.py): its requests fail now, naming
        it; new ones are refused; the process gets SIGTERM, then SIGKILL a second later (a stopped
        or stuck process answers neither Shutdown nor SIGTERM). Its exit is a crash, as any other."""
        if self.hung is not None or self.state is not State.READY:
            return
        self.hung = why
        self.log.error("worker hung; killing it", reason=why, steps=self.beat.steps, step_s=self.beat.step_s,
                       requests=[(p.log_id, p.n_tokens) for p in self._queues.values()])  # fmt: skip
        self._dying = f"hung: {why}"
        message = (f"the worker for {self.key.model} made no progress: {why}; it was stopped, and the next request "
                   "starts a new one")  # fmt: skip
        self._refusal = message
        for p in self._queues.values():
            p.queue.put_nowait(WorkerDied(message))
        self.publish("hung", why)
        self._killing = asyncio.create_task(self._kill(), name=f"kill:{self.key.slug}")

    async def gone(self) -> None:
        """Wait until the process has exited and the handle is torn down."""
        if self._watcher is not None:
            await asyncio.shield(self._watcher)

    async def _kill(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        if not await _exited(proc, 1.0):
            proc.kill()

    async def warmup(self) -> None:
        req_id, pending = self._admit("")
        try:
            self._send(Warmup(req_id))
            await within(_next(pending.queue))
        finally:
            self._queues.pop(req_id, None)
            self._left()

    async def call(self, msg: OneShot, timeout: float | None = None) -> Answer:
        """Send a one-shot request and return its one reply; raise for Failed, a dead worker, or no
        answer within `timeout` seconds (by default its kind's CALL_TIMEOUT_S)."""
        req_id, pending = self._admit(msg.log_id)
        answered = False
        limit = CALL_TIMEOUT_S[type(msg)] if timeout is None else timeout
        try:
            self._send(msgspec.structs.replace(msg, req_id=req_id))
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation that meets
            # the answer in one loop turn, and a caller that loops (a realtime session's VAD) then
            # never learns it was cancelled (bench/realtime.py found sessions that never closed).
            scope = asyncio.timeout(limit)
            try:
                async with scope:
                    reply = await within(_next(pending.queue))
            except TimeoutError:
                if not scope.expired():
                    raise  # the request's own deadline (within) says so itself
                kind = type(msg).__struct_config__.tag
                raise GatewayTimeout(f"the worker for {self.key.model} did not answer this {kind} request within "
                                     f"{limit:g} s; it was cancelled") from None  # fmt: skip
            answered = True
            self.requests_served += 1
            return reply  # type: ignore[return-value]  # a one-shot's reply is its answer
        finally:
            if not answered:
                self.cancel(req_id)  # the client left, or the worker refused (then a no-op)
            self._left()

    def generate(self, msg: Generate) -> AsyncIterator[Streamed]:
        """Yield this generation's Started, Deltas and final Done; raise for Failed or a dead worker."""
        return self._stream(msg)  # type: ignore[return-value]  # a generation's replies are Started and Deltas

    def speak(self, msg: Speak) -> AsyncIterator[Audio | Done]:
        """Yield this text's Audio, a sentence at a time, and the final Done; raise for Failed or a dead worker."""
        return self._stream(msg)  # type: ignore[return-value]  # a Speak's replies are Audio until its Done

    def transcribe(self, msg: Transcribe) -> AsyncIterator[TranscriptPart | Transcript]:
        """Yield a streamed transcription's segments as they are decoded, then the whole Transcript;
        raise for Failed or a dead worker."""
        return self._stream(msgspec.structs.replace(msg, stream=True))  # type: ignore[return-value]

    async def _stream(self, msg: Generate | Speak | Transcribe) -> AsyncIterator[object]:
        """A request answered by several replies, then its last (Done, or a Transcript). Closed early
        (the client left), it cancels the request on the worker."""
        req_id, pending = self._admit(msg.log_id)
        finished = False
        try:
            self._send(msgspec.structs.replace(msg, req_id=req_id))
            while True:
                reply = await within(_next(pending.queue))
                if isinstance(reply, LAST_REPLIES):
                    finished = True
                    self.requests_served += 1
                    self._left()
                    yield reply
                    return
                yield reply
        finally:
            if not finished:
                self.cancel(req_id)
                self._left()


async def _next(q: asyncio.Queue[object]) -> object:
    msg = await q.get()
    if isinstance(msg, GenieXError):
        raise msg
    if isinstance(msg, Failed):
        raise error_for(msg.kind, msg.message, msg.code)
    return msg


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    try:
        async with asyncio.timeout(timeout):
            await proc.wait()
        return True
    except TimeoutError:
        return False
