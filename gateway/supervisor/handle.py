"""The gateway's side of one worker process: its subprocess, its sockets, its requests.

One reader task routes every reply to the per-request queue it belongs to. One
monitor task waits on the process; when it exits, every waiting request is woken
with the reason at once, so nothing hangs on a dead worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import structlog
import zmq
import zmq.asyncio

from gateway.api.request_id import current_request_id
from gateway.errors import (
    BadRequest,
    EngineFailure,
    GenieXError,
    Overloaded,
    WorkerDied,
    WorkerUnavailable,
)
from gateway.supervisor.states import IllegalTransition, State, can_move
from protocol.keys import WorkerKey
from protocol.wire import (
    PROTOCOL_VERSION,
    Cancel,
    Delta,
    Done,
    Dying,
    Failed,
    Generate,
    Ready,
    SetThreads,
    Shutdown,
    Warmup,
    gateway_codec,
)

log = structlog.get_logger("gateway.worker")

def _error_for(failed: Failed) -> GenieXError:
    cls = {400: BadRequest, 503: WorkerUnavailable}.get(failed.status, EngineFailure)
    return cls(failed.message, code=failed.code)


class WorkerSpec:
    """What a handle needs to start its process; the pool fills it in."""

    def __init__(
        self,
        key: WorkerKey,
        model_path: str,
        engine: str,
        ngl: int,
        parallel: int,
        threads: int,
        log_level: str,
        load_timeout: float,
        max_queue: int,
        stream_interval_ms: int = 0,
        nice: int = 0,
    ) -> None:
        self.key = key
        self.model_path = model_path
        self.engine = engine
        self.ngl = ngl
        self.parallel = parallel
        self.threads = threads
        self.log_level = log_level
        self.load_timeout = load_timeout
        self.max_queue = max_queue
        self.stream_interval_ms = stream_interval_ms
        self.nice = nice


class _Pending:
    """One request in flight: where its replies go, how far it has got, and its request id."""

    __slots__ = ("queue", "n_tokens", "log_id")

    def __init__(self, log_id: str) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.n_tokens = 0
        self.log_id = log_id


ExitCallback = Callable[["WorkerHandle", bool], None]
IdleCallback = Callable[["WorkerHandle"], None]  # also used for "became busy"


class WorkerHandle:
    def __init__(
        self,
        spec: WorkerSpec,
        zctx: zmq.asyncio.Context,
        runtime_dir: Path,
        on_exit: ExitCallback | None = None,
        on_idle: IdleCallback | None = None,
        on_busy: IdleCallback | None = None,
    ) -> None:
        self.spec = spec
        self.key = spec.key
        self.state = State.STARTING
        self.ready_info: Ready | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.started_at = time.time()
        self.last_used = time.monotonic()
        self.requests_served = 0
        self.exit_reason: str | None = None
        self.keepalive: float | None = None  # a request's `keep_alive` overrides --keepalive
        self.tokens_generated = 0
        self._on_exit = on_exit
        self._on_idle = on_idle
        self._on_busy = on_busy
        self.threads: int | None = None  # the last SetThreads sent; None: the worker's own default
        self._codec = gateway_codec()
        self._ids = itertools.count(1)
        self._queues: dict[int, _Pending] = {}
        self._cancelled: dict[int, int] = {}  # req_id -> tokens relayed when the cancel was sent
        self._ready: asyncio.Future[Ready] = asyncio.get_running_loop().create_future()
        self._dying: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        slug = spec.key.slug
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

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def inflight(self) -> int:
        return len(self._queues)

    @property
    def status(self) -> str:
        """The state as operators read it: a ready worker is busy or idle."""
        if self.state is State.READY:
            return "busy" if self._queues else "idle"
        return self.state.value

    @property
    def alive(self) -> bool:
        return self.state in (State.STARTING, State.READY)

    # ---- lifecycle ---------------------------------------------------------

    async def start(self) -> Ready:
        s = self.spec
        cmd = [
            sys.executable, "-m", "workers",
            "--engine", s.engine,
            "--model", s.model_path,
            "--compute", s.key.compute,
            "--nctx", str(s.key.nctx),
            "--ngl", str(s.ngl),
            "--parallel", str(s.parallel),
            "--threads", str(s.threads),
            "--stream-interval-ms", str(s.stream_interval_ms),
            "--nice", str(s.nice),
            "--inbox", self._inbox,
            "--outbox", self._outbox,
            "--parent-pid", str(os.getpid()),
            "--name", s.key.slug,
            "--log-level", s.log_level,
        ]  # fmt: skip
        self.log.debug("worker command", argv=cmd)
        self.proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL)
        self.log = self.log.bind(pid=self.proc.pid)
        self.log.info("worker spawned", model=s.key.model, engine=s.engine)
        # The worker outlives the request that started it: its tasks log without that request's id.
        self._tasks = [
            asyncio.create_task(self._read_replies(), name=f"read:{s.key.slug}", context=contextvars.Context()),
            asyncio.create_task(self._watch_process(), name=f"watch:{s.key.slug}", context=contextvars.Context()),
        ]
        try:
            ready = await asyncio.wait_for(asyncio.shield(self._ready), s.load_timeout)
        except TimeoutError:
            await self.stop(graceful=False)
            raise WorkerUnavailable(
                f"worker for {s.key.model} did not become ready within {s.load_timeout:g}s; "
                "raise --load-timeout if the model is large, or check the worker's log"
            ) from None
        except GenieXError:
            raise
        if ready.protocol_version != PROTOCOL_VERSION:
            await self.stop(graceful=False)
            raise WorkerUnavailable(f"worker speaks protocol {ready.protocol_version}, gateway {PROTOCOL_VERSION}")
        self.ready_info = ready
        self._move(State.READY)
        return ready

    async def stop(self, *, graceful: bool = True, timeout: float = 10.0) -> None:
        """Graceful: wait for in-flight requests (up to `timeout`), then Shutdown, then signals."""
        if self.state in (State.STOPPED, State.FAILED):
            return
        if self.state is not State.STOPPING:
            self._move(State.STOPPING)
        proc = self.proc
        if proc is not None and proc.returncode is None:
            if graceful:
                deadline = time.monotonic() + timeout
                while self._queues and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                self._send(Shutdown())
                if await self._exited(proc, 3.0):
                    return await self._finish()
            proc.send_signal(signal.SIGTERM)
            if not await self._exited(proc, 3.0):
                proc.kill()
                await proc.wait()
        await self._finish()

    async def _finish(self) -> None:
        for t in self._tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self._fail_all(WorkerDied(f"worker for {self.key.model} was stopped"))
        self._push.close(0)
        self._pull.close(0)
        if self.state is State.STOPPING:
            self._move(State.STOPPED)
            if self._on_exit is not None:
                self._on_exit(self, False)

    @staticmethod
    async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
        try:
            await asyncio.wait_for(proc.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def _watch_process(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        if self.state is State.STOPPING:
            return
        if code < 0:
            reason = f"killed by {signal.Signals(-code).name}"
        else:
            reason = f"exited with status {code}"
        if self._dying:
            reason += f": {self._dying}"
        self.exit_reason = reason
        self.log.error("worker died", reason=reason, inflight=len(self._queues),
                       requests=[p.log_id for p in self._queues.values()])  # fmt: skip
        err = WorkerDied(f"worker for {self.key.model} died ({reason})")
        if not self._ready.done():
            self._ready.set_exception(err)
            self._ready.exception()  # mark retrieved; start() re-raises it
        self._move(State.FAILED)
        self._fail_all(err)
        if self._on_exit is not None:
            self._on_exit(self, True)
        for t in self._tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self._push.close(0)
        self._pull.close(0)

    def _fail_all(self, err: GenieXError) -> None:
        for p in self._queues.values():
            p.queue.put_nowait(err)
        self._queues.clear()

    async def _read_replies(self) -> None:
        decode = self._codec.decode
        while True:
            raw = await self._pull.recv(copy=False)
            msg = decode(raw.buffer)
            if isinstance(msg, Delta):
                p = self._queues.get(msg.req_id)
                if p is not None:
                    p.n_tokens = msg.n_tokens
                    p.queue.put_nowait(msg)
            elif isinstance(msg, (Done, Failed)):
                p = self._queues.pop(msg.req_id, None)
                if p is not None:
                    p.queue.put_nowait(msg)
                elif isinstance(msg, Done) and msg.req_id in self._cancelled:
                    relayed = self._cancelled.pop(msg.req_id)
                    self.log.info("cancel confirmed", relayed_tokens=relayed, generated_tokens=msg.completion_tokens,
                                  overshoot=max(0, msg.completion_tokens - relayed))  # fmt: skip
                if isinstance(msg, Done):
                    self.tokens_generated += msg.completion_tokens
            elif isinstance(msg, Ready):
                if not self._ready.done():
                    self._ready.set_result(msg)
            elif isinstance(msg, Dying):
                self._dying = msg.message
                self.log.error("worker dying", error=msg.message)
            elif (req_id := getattr(msg, "req_id", None)) is not None:
                # A one-shot result (logits, embeddings...): its request's only reply.
                p = self._queues.pop(req_id, None)
                if p is not None:
                    p.queue.put_nowait(msg)

    # ---- requests ----------------------------------------------------------

    def _send(self, msg: object) -> None:
        try:
            self._push.send(self._codec.encode(msg), flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # a dead worker is reported by the monitor, with its real cause

    def _admit(self) -> tuple[int, _Pending]:
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
        pending = self._queues[req_id] = _Pending(current_request_id() or "")
        if became_busy and self._on_busy is not None:
            self._on_busy(self)
        self.last_used = time.monotonic()
        return req_id, pending

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

    async def warmup(self) -> None:
        req_id, pending = self._admit()
        self._send(Warmup(req_id))
        await self._next(pending.queue)

    async def call(self, make: Callable[[int], object]) -> object:
        """Send the one-shot request `make(req_id)` and return its one reply; raise for Failed."""
        req_id, pending = self._admit()
        answered = False
        try:
            self._send(make(req_id))
            reply = await self._next(pending.queue)
            answered = True
            self.requests_served += 1
            return reply
        finally:
            if not answered:
                self.cancel(req_id)  # the client left, or the worker refused (then a no-op)
            self._left()

    async def generate(self, **fields: object) -> AsyncIterator[Delta | Done]:
        """Yield this request's Deltas and its final Done; raise for Failed or a dead worker."""
        req_id, pending = self._admit()
        finished = False
        try:
            self._send(Generate(req_id=req_id, **fields))  # type: ignore[arg-type]
            while True:
                msg = await self._next(pending.queue)
                if isinstance(msg, Done):
                    finished = True
                    self.requests_served += 1
                    self._left()
                    yield msg
                    return
                yield msg
        finally:
            if not finished:
                self.cancel(req_id)
                self._left()

    def _left(self) -> None:
        self.last_used = time.monotonic()
        if not self._queues and self._on_idle is not None:
            self._on_idle(self)

    @staticmethod
    async def _next(q: asyncio.Queue[object]) -> Delta | Done:
        msg = await q.get()
        if isinstance(msg, GenieXError):
            raise msg
        if isinstance(msg, Failed):
            raise _error_for(msg)
        return msg  # type: ignore[return-value]
