"""Relays a worker's Deltas to the client: one JSON body, or SSE chunks as they come.

A request with `n` choices runs as n generations on the worker; their messages arrive
tagged with the choice index, and each choice is shaped by its own ChoiceShaper.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

import msgspec

from gateway.chat.shape import ChoiceShaper
from gateway.http.encoding import encode
from gateway.http.stream_billing import FINAL, Stream, billed
from gateway.ops.accounting import Accounting
from gateway.supervisor.handle import Streamed, WorkerHandle
from protocol.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    CompletionTokensDetails,
    PromptTokensDetails,
    Usage,
)
from protocol.overflow import Truncated
from protocol.wire import Delta, Done, Generate, Started

CHUNK = "chat.completion.chunk"
T = TypeVar("T")


class Completion:
    """Identity shared by a response and all of its chunks (id, created, model), each choice's
    progress, and the request's accounting, settled with the usage it adds up to."""

    def __init__(self, model: str, accounting: Accounting, n: int = 1, per_prompt: int = 0,
                 id_prefix: str = "chatcmpl") -> None:  # fmt: skip
        self.id = f"{id_prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.n = n
        self.per_prompt = per_prompt or n  # choices i // per_prompt share one prompt, counted once
        self.dones: dict[int, Done] = {}
        self.tokens = [0] * n  # completion tokens so far, per choice
        self.accounting = accounting
        self.speculative = False  # report draft tokens accepted/rejected in the usage
        self.truncated: Truncated | None = None  # what `truncation: auto` dropped from the prompt

    def run_on(self, worker: WorkerHandle, generations: Sequence[Generate]) -> AsyncIterator[Tagged]:
        """Run the generations on `worker` (fan_out), noting the unit its energy is counted under."""
        self.accounting.compute = worker.key.compute
        return fan_out(worker, generations)

    def started(self, msg: Started) -> None:
        """A choice's prompt was admitted: its energy counts from now (gateway/ops/energy.py), and
        what truncation dropped from it is noted (every choice of a request reads the same prompt, so
        the first to report it speaks for all)."""
        self.accounting.running()
        if msg.dropped_messages and self.truncated is None:
            self.truncated = Truncated(messages=msg.dropped_messages, tokens=msg.dropped_tokens)

    def first_token(self) -> None:
        self.accounting.first_token()

    def settle(self, outcome: str) -> None:
        """Count the request once, in the metrics and the ledger, whichever exit the relay takes;
        an answer that ended "ok" with a choice the worker cancelled counts as cancelled."""
        if outcome == "ok" and any(d.finish_reason == "cancelled" for d in self.dones.values()):
            outcome = "cancelled"
        u = self.usage()
        cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
        self.accounting.settle(outcome, u.prompt_tokens, u.completion_tokens, cached)

    def record_done(self, index: int, done: Done) -> bool:
        """Record one choice's Done; True once every choice is done."""
        self.dones[index] = done
        return len(self.dones) == self.n

    async def guard(self, work: Awaitable[T]) -> T:
        """Await `work`; if it raises, count the request as failed or cancelled, then re-raise."""
        return await self.accounting.guard(work, self._so_far)

    def _so_far(self) -> tuple[int, int]:
        u = self.usage()
        return u.prompt_tokens, u.completion_tokens

    def usage(self) -> Usage:
        """Each prompt once (the n choices of a prompt read the same one), the completions of all choices."""
        dones = self.dones
        groups: dict[int, int] = {}
        for i, d in dones.items():
            groups[i // self.per_prompt] = max(groups.get(i // self.per_prompt, 0), d.prompt_tokens)
        prompt = sum(groups.values())
        completion = sum(dones[i].completion_tokens if i in dones else self.tokens[i] for i in range(self.n))
        # Each prompt's reused tokens as its first choice reports them (the prompt is billed once).
        cached = sum(d.cached_tokens for i, d in dones.items() if i % self.per_prompt == 0)
        details = PromptTokensDetails(cached_tokens=cached) if cached else None
        spec = None
        reasoning = sum(d.reasoning_tokens for d in dones.values())
        if (self.speculative or reasoning) and dones:
            spec = CompletionTokensDetails(
                accepted_prediction_tokens=sum(d.accepted_tokens for d in dones.values()),
                rejected_prediction_tokens=sum(d.rejected_tokens for d in dones.values()),
                reasoning_tokens=reasoning or msgspec.UNSET,
            )
        # Its energy once every choice is done: the first ask ends its share (an extension, omitted where unknown).
        energy = self.accounting.energy_j() if len(dones) == self.n else None
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=details, completion_tokens_details=spec, energy_j=energy)  # fmt: skip


Tagged = tuple[int, Streamed]


def fan_out(worker: WorkerHandle, generations: Sequence[Generate]) -> AsyncIterator[Tagged]:
    """Run each Generate as a generation on `worker`; their messages tagged with their index."""
    streams = [worker.generate(g) for g in generations]
    return tagged(streams[0]) if len(streams) == 1 else merged(streams)


async def tagged(stream: AsyncIterator[Streamed]) -> AsyncIterator[Tagged]:
    """One generation's messages as choice 0."""
    async for msg in stream:
        yield 0, msg


async def merged(streams: Sequence[AsyncIterator[Streamed]]) -> AsyncIterator[Tagged]:
    """The messages of n generations, tagged with their choice index, in arrival order.

    Closing this closes every generation (each one cancels its request if unfinished).
    """
    queue: asyncio.Queue[tuple[int, Streamed | BaseException]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[Streamed]) -> None:
        try:
            async for msg in stream:
                queue.put_nowait((i, msg))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, who raises it
            queue.put_nowait((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, Done):
                left -= 1
            yield i, item
    finally:
        # Cancelling a pump throws into the generation it is awaiting, whose own `finally`
        # then cancels its request on the worker; wait for that rather than aclose() a
        # generator another task is still running.
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


OnStarted = Callable[[int, Started], None]


def _ignore(_i: int, _msg: Started) -> None:
    pass


async def collect_events(c: Completion, stream: AsyncIterator[Tagged], on_delta: Callable[[int, Delta], None],
                         on_done: Callable[[int, Done], None], on_started: OnStarted = _ignore) -> None:  # fmt: skip
    """The whole answer of any completion, chat or text: each choice's Started to `on_started`,
    each Delta to `on_delta`, each Done to `on_done`, and the request settled once every choice is done.
    The answer goes out whole at the end, so one that fails or is left before then bills nothing."""
    c.accounting.bills_partial = False
    async for i, msg in stream:
        if isinstance(msg, Started):
            c.started(msg)
            on_started(i, msg)
            continue
        if isinstance(msg, Done):
            on_done(i, msg)
            if c.record_done(i, msg):
                c.settle("ok")
                return
            continue
        c.first_token()
        c.tokens[i] = msg.n_tokens
        on_delta(i, msg)


async def collect(c: Completion, shapers: list[ChoiceShaper], stream: AsyncIterator[Tagged]) -> ChatCompletion:
    reasons: dict[int, str] = {}

    def on_delta(i: int, msg: Delta) -> None:
        shaper = shapers[i]
        if shaper.plain:  # as in sse(): plain text needs no parsing, just keeping
            shaper.content.append(msg.text)
        else:
            shaper.feed(msg.text, msg.logprobs)

    def on_done(i: int, msg: Done) -> None:
        shapers[i].finish()
        reasons[i] = shapers[i].finish_reason(msg.finish_reason)

    await collect_events(c, stream, on_delta, on_done, lambda i, msg: shapers[i].start(msg.reasoning_open))
    choices = [
        Choice(index=s.index, message=s.message(), finish_reason=reasons.get(s.index), logprobs=s.choice_logprobs())
        for s in shapers
    ]
    return ChatCompletion(id=c.id, created=c.created, model=c.model, choices=choices, usage=c.usage(),
                          truncated=c.truncated or msgspec.UNSET)  # fmt: skip


def _chunk(c: Completion, index: int, delta: ChunkDelta, finish: str | None = None,
           logprobs: ChoiceLogprobs | None = None, truncated: Truncated | None = None) -> bytes:  # fmt: skip
    choice = ChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)
    return encode(ChatCompletionChunk(id=c.id, object=CHUNK, created=c.created, model=c.model, choices=[choice],
                                      truncated=truncated))  # fmt: skip


def sse(c: Completion, shapers: list[ChoiceShaper], first: Tagged, rest: AsyncIterator[Tagged],
              include_usage: bool) -> AsyncIterator[bytes]:  # fmt: skip
    """Chat's SSE `data:` payloads (see `stream_events`)."""

    def on_delta(i: int, msg: Delta) -> bytes | None:
        if plain:  # the common case costs one chunk per Delta and nothing else
            return _chunk(c, i, ChunkDelta(content=msg.text)) if msg.text else None
        piece = shapers[i].feed(msg.text, msg.logprobs)
        return None if piece is None else _chunk(c, i, piece[0], None, piece[1])

    def on_done(i: int, msg: Done) -> tuple[bytes | None, bytes]:
        shaper = shapers[i]
        tail = shaper.finish()
        last = _chunk(c, i, tail[0], None, tail[1]) if tail is not None else None
        return last, _chunk(c, i, ChunkDelta(), shaper.finish_reason(msg.finish_reason))

    def usage() -> bytes:
        return encode(
            ChatCompletionChunk(id=c.id, object=CHUNK, created=c.created, model=c.model, choices=[], usage=c.usage())
        )

    plain = all(s.plain for s in shapers)
    if isinstance(first[1], Started):  # the opening chunks go out first: they carry what truncation dropped
        c.started(first[1])
    opening = [_chunk(c, s.index, ChunkDelta(role="assistant", content=""), truncated=c.truncated) for s in shapers]
    return stream_events(
        c,
        first,
        rest,
        opening,
        on_delta,
        on_done,
        usage if include_usage else None,
        lambda i, msg: shapers[i].start(msg.reasoning_open),
    )


def stream_events(c: Completion, first: Tagged, rest: AsyncIterator[Tagged], opening: list[bytes],
                  on_delta: Callable[[int, Delta], bytes | None],
                  on_done: Callable[[int, Done], tuple[bytes | None, bytes]],
                  usage: Callable[[], bytes] | None, on_started: OnStarted = _ignore) -> AsyncIterator[bytes]:  # fmt: skip
    """SSE `data:` payloads of any streamed completion, chat or text: `opening`, then a payload per
    Delta (`on_delta`; None sends nothing), and per choice's Done the payloads `on_done` gives: the
    first before the request is counted (None: nothing), the second (the last choice's: the start
    of the ending) after; then the usage payload (when asked for) and [DONE]. Errors after the
    first byte become an error payload, then [DONE]."""

    async def payloads() -> Stream[bytes]:
        for payload in opening:
            yield payload
        item = first
        while True:
            i, msg = item
            if isinstance(msg, Started):
                c.started(msg)
                on_started(i, msg)
            elif isinstance(msg, Done):
                before, after = on_done(i, msg)
                if before is not None:
                    yield before
                if c.record_done(i, msg):
                    yield FINAL
                    yield after
                    break
                yield after
            else:
                c.first_token()
                c.tokens[i] = msg.n_tokens
                if (chunk := on_delta(i, msg)) is not None:
                    yield chunk
            item = await anext(rest)
        if usage is not None:
            yield usage()
        yield b"[DONE]"

    return billed(payloads(), c.settle, lambda exc: [encode({"error": exc.message}), b"[DONE]"])
