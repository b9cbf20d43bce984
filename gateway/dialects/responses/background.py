"""`background: true` responses: each runs as a task of its own, not the request's, so no client's
disconnect stops it; its events are logged as they come (bounded) for whoever follows or replays
them (`GET /v1/responses/{id}?stream=true&starting_after=N`), and its end is written to the store.

A running response counts as a request in flight (gateway/http/lifecycle.py), so SIGTERM's drain
waits for it; if the drain runs out of time it is cancelled, before the pool's own abort, and
ends `cancelled` with the reason in its `error`. Bounds: per key and in all (a 429 past either).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
import structlog

from gateway.errors import GenieXError
from gateway.http.encoding import encode
from gateway.http.lifecycle import Lifecycle
from protocol import responses as r

log = structlog.get_logger("gateway.responses")

Event = tuple[str, int, bytes]  # (its `type`, its `sequence_number`, its JSON)

_TERMINAL = (r.Completed, r.Incomplete, r.Failed)


class TooManyBackground(GenieXError):
    status = 429

    def __init__(self, message: str) -> None:
        super().__init__(message, code="rate_limit_exceeded", headers={"Retry-After": "5"})


@dataclass(eq=False)
class Job:
    owner: str
    response: r.Response  # as a GET shows it now
    max_event_bytes: int
    events: list[Event] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    event_bytes: int = 0
    skipped: int = 0  # events not kept, past the bound
    output: Callable[[], list[r.OutputItem]] = list  # the items made so far (the run's)
    stop: str = ""  # why it was stopped: "cancel", "drain"
    done: asyncio.Event = field(default_factory=asyncio.Event)  # its end is in the store
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # replaced on every new event
    task: asyncio.Task[None] | None = None

    @property
    def finished(self) -> bool:
        return self.response.status not in ("queued", "in_progress")

    def add(self, ev: msgspec.Struct) -> None:
        response = getattr(ev, "response", None)
        if isinstance(response, r.Response):
            self.response = response
        data = encode(ev)
        if self.event_bytes + len(data) > self.max_event_bytes and not isinstance(ev, _TERMINAL):
            self.skipped += 1
        else:
            self.event_bytes += len(data)
            self.events.append((ev.__struct_config__.tag, ev.sequence_number, data))  # type: ignore[arg-type, attr-defined]
            self.seqs.append(ev.sequence_number)  # type: ignore[attr-defined]
        self._wake()

    def _wake(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    def end(self, status: r.Status, message: str | None) -> None:
        """Its end without a terminal event of the run's: failed before it began, or stopped."""
        error = r.ResponseError("server_error", message) if message else None
        self.response = msgspec.structs.replace(self.response, status=status, error=error, output=self.output())
        if status == "failed":
            seq = (self.seqs[-1] + 1) if self.seqs else 0
            self.add(r.Failed(seq, self.response))
        self._wake()

    async def follow(self, after: int) -> AsyncIterator[Event]:
        """Its events after sequence number `after` (-1: all), then the new ones as they come, until it ends."""
        pos = bisect.bisect_right(self.seqs, after)
        while True:
            changed = self.changed
            while pos < len(self.events):
                yield self.events[pos]
                pos += 1
            if self.done.is_set() or (self.finished and pos >= len(self.events)):
                return
            await changed.wait()


class Jobs:
    def __init__(self, lifecycle: Lifecycle, per_key: int, total: int, max_event_bytes: int,
                 drain_timeout_s: float) -> None:  # fmt: skip
        self.lifecycle = lifecycle
        self.per_key = per_key
        self.total = total
        self.max_event_bytes = max_event_bytes
        self.drain_timeout_s = drain_timeout_s
        self.running: dict[tuple[str, str], Job] = {}

    def get(self, owner: str, response_id: str) -> Job | None:
        return self.running.get((owner, response_id))

    def admit(self, owner: str) -> None:
        """A 429 past either bound, before anything is queued."""
        if len(self.running) >= self.total:
            raise TooManyBackground(f"`background`: {len(self.running)} background responses are queued or running, "
                                    "the server's bound (--responses-background-max); retry when one has finished")  # fmt: skip
        mine = sum(1 for o, _ in self.running if o == owner)
        if mine >= self.per_key:
            raise TooManyBackground(f"`background`: this key has {mine} background responses queued or running, its "
                                    "bound (--responses-background-per-key); retry when one has finished")  # fmt: skip

    def start(self, owner: str, response: r.Response, events: Callable[[Job], AsyncIterator[msgspec.Struct]],
              conclude: Callable[[Job], Awaitable[None]]) -> Job:  # fmt: skip
        """Run `events(job)` (the response's stream) to its end in a task of its own; then
        `conclude(job)` (which stores it). The response is queued until its first event."""
        job = Job(owner, response, self.max_event_bytes)
        self.running[(owner, response.id)] = job
        job.task = asyncio.create_task(self._work(job, events, conclude), name=f"background {response.id}")
        return job

    async def _work(self, job: Job, events: Callable[[Job], AsyncIterator[msgspec.Struct]],
                    conclude: Callable[[Job], Awaitable[None]]) -> None:  # fmt: skip
        self.lifecycle.inflight += 1  # the drain waits for it, as for a request
        rid = job.response.id
        try:
            try:
                async for ev in events(job):
                    job.add(ev)
                if not job.finished:  # a run always ends with its terminal event; this is a guard
                    job.end("failed", "the response ended without an answer")
            except GenieXError as exc:
                log.warning("background response failed", response=rid, status=exc.status, error=exc.message)
                job.end("failed", exc.message)
            except asyncio.CancelledError:
                if job.stop == "drain":
                    why = (f"cancelled: the server was shutting down and its drain timeout "
                           f"({self.drain_timeout_s:g} s, --drain-timeout-s) ran out before this response finished")  # fmt: skip
                    log.warning("background response cancelled by the drain", response=rid)
                    job.end("cancelled", why)
                else:
                    log.info("background response cancelled", response=rid)
                    job.end("cancelled", None)
            else:
                if self.lifecycle.draining:
                    log.info("background response finished during the drain", response=rid)
            await conclude(job)
        except Exception as exc:  # a task's error would otherwise be lost
            log.exception("background response not stored", response=rid, error=repr(exc))
        finally:
            self.running.pop((job.owner, rid), None)
            self.lifecycle.inflight -= 1
            job.done.set()
            job._wake()

    async def cancel(self, job: Job, why: str = "cancel") -> None:
        """Stop it (the worker's generation is cancelled on the way out) and wait until its end is stored."""
        if job.task is not None and not job.done.is_set():
            job.stop = job.stop or why
            job.task.cancel()
        await job.done.wait()

    def drain_timed_out(self) -> None:
        """The drain's time ran out: every background response still running is cancelled, saying why."""
        jobs = list(self.running.values())
        for job in jobs:
            job.stop = "drain"
            if job.task is not None:
                job.task.cancel()
        if jobs:
            log.warning("drain timed out; background responses cancelled", responses=[j.response.id for j in jobs])

    async def close(self) -> None:
        """At shutdown: any still running is cancelled as by the drain; their ends are stored."""
        self.drain_timed_out()
        waiting = [job.done.wait() for job in list(self.running.values())]
        if waiting:
            async with asyncio.timeout(10):
                await asyncio.gather(*waiting)
