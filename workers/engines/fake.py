"""A fake text generator for testing the gateway's supervision against real worker processes.

Its "model file" is JSON that says how to behave:

    {"delay_ms": 5,         each decode step takes this long
     "tokens": 20,          a generation ends ("stop") after this many tokens, unless max_tokens is lower
     "crash_after": 7,      the process dies (exit status 3) once this many tokens were generated in all
     "load_s": 0,           loading takes this long
     "hang_on_load": false, loading never ends
     "embed_unanswered": false, an Embed is taken and never answered (a hung one-shot call)
     "hang_after": 5,       a decode step never returns once this many tokens were generated in all
                            (a call stuck in a driver: the process runs, its heartbeat goes on)
     "slow_step_s": 0,      a step after the first token takes this long (a long, legitimate step)
     "gpu_offload": false}  what its Ready says of its build's GPU offload (what the gateway learns)

Every field is optional. A prompt of "refuse" is refused (EngineError); "raise" meets a bug (RuntimeError). It answers Generate like the llama.cpp engine does (Started, Deltas of
"tok1 ", "tok2 ", ..., Done) with `--parallel` slots, so queueing, cancellation, crashes, load
timeouts and eviction can be tested in seconds, without a model.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass

import msgspec

from protocol.wire import PROTOCOL_VERSION, Delta, Done, Embed, ErrorKind, Generate, Ready, Started
from workers.engines import Emit, EngineError, EngineOptions


class Behaviour(msgspec.Struct, forbid_unknown_fields=True):
    delay_ms: float = 0.0
    tokens: int = 20
    crash_after: int | None = None
    load_s: float = 0.0
    hang_on_load: bool = False
    embed_unanswered: bool = False
    gpu_offload: bool = False
    hang_after: int | None = None
    slow_step_s: float = 0.0


@dataclass
class _Running:
    req: Generate
    limit: int
    n: int = 0


class FakeEngine:
    name = "fake"
    serves: tuple[type, ...] = (Generate, Embed)

    def __init__(self, opts: EngineOptions) -> None:
        try:
            with open(opts.model_path, "rb") as f:
                self.behaviour = msgspec.json.decode(f.read(), type=Behaviour)
        except (OSError, msgspec.DecodeError) as exc:
            raise EngineError(f"fake engine: cannot read {opts.model_path}: {exc}") from exc
        if self.behaviour.hang_on_load:
            while True:
                time.sleep(3600)
        time.sleep(self.behaviour.load_s)
        self.compute = opts.compute
        self.nctx = opts.nctx
        self.parallel = max(1, opts.parallel or 1)
        self.threads = opts.threads
        self.waiting: deque[Generate] = deque()
        self.running: list[_Running] = []
        self.generated = 0
        self.unanswered: set[int] = set()  # Embeds taken and never answered

    def ready(self) -> Ready:
        return Ready(protocol_version=PROTOCOL_VERSION, pid=os.getpid(), engine=self.name, compute=self.compute,
                     n_ctx=self.nctx, parallel=self.parallel, description="fake engine",
                     gpu_offload=self.behaviour.gpu_offload)  # fmt: skip

    def submit(self, req: Generate | Embed) -> None:
        if isinstance(req, Embed):
            if not self.behaviour.embed_unanswered:
                raise EngineError("the fake engine embeds nothing", kind=ErrorKind.UNSUPPORTED)
            self.unanswered.add(req.req_id)
            return
        if req.prompt == "refuse":
            raise EngineError("`prompt`: refused, as asked")
        if req.prompt == "raise":
            raise RuntimeError("a bug met by one request")
        self.waiting.append(req)

    def cancel(self, req_id: int, emit: Emit) -> None:
        self.unanswered.discard(req_id)
        for req in self.waiting:
            if req.req_id == req_id:
                self.waiting.remove(req)
                emit(Done(req_id, "cancelled"))
                return
        for r in self.running:
            if r.req.req_id == req_id:
                self.running.remove(r)
                emit(Done(req_id, "cancelled", completion_tokens=r.n))
                return

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self, emit: Emit) -> None:
        while self.waiting and len(self.running) < self.parallel:
            req = self.waiting.popleft()
            limit = min(self.behaviour.tokens, req.max_tokens or self.behaviour.tokens)
            self.running.append(_Running(req, limit))
            emit(Started(req.req_id, prompt_tokens=1))
        time.sleep(self.behaviour.delay_ms / 1000)
        if self.behaviour.hang_after is not None and self.generated >= self.behaviour.hang_after:
            while True:
                time.sleep(3600)
        if self.behaviour.slow_step_s and self.generated:
            time.sleep(self.behaviour.slow_step_s)
        for r in list(self.running):
            r.n += 1
            self.generated += 1
            if self.behaviour.crash_after is not None and self.generated >= self.behaviour.crash_after:
                os._exit(3)
            emit(Delta(r.req.req_id, f"tok{r.n} ", r.n))
            if r.n >= r.limit:
                self.running.remove(r)
                reason = "length" if r.req.max_tokens is not None and r.n >= r.req.max_tokens else "stop"
                emit(Done(r.req.req_id, reason, prompt_tokens=1, completion_tokens=r.n))

    def set_threads(self, n: int) -> None:
        self.threads = n

    def idle(self) -> None:
        pass

    def close(self) -> None:
        pass


def load(opts: EngineOptions) -> FakeEngine:
    return FakeEngine(opts)
