"""The chat engine's sequence slots: who waits, who runs in which KV sequence, what each keeps.

A request waits in `Slots.waiting` (already tokenized, its sampler built) until a slot is free;
`admit` gives it the slot whose kept KV shares the longest prefix with its prompt (a
GenieX-KeepCache request) or an empty one, keeps the shared prefix's KV and drops the rest.
`release` frees a slot and its KV, unless the request asked to keep it for the next turn.
"""

from __future__ import annotations

import ctypes
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import llama_cpp as L
import structlog

from protocol.wire import Generate, Speculation, Started, TokenLogprob
from workers.engines import Emit
from workers.engines.llama.draft_model import SpecState
from workers.engines.llama.sampling import Sampler
from workers.engines.llama.text_stream import TextStream

log = structlog.get_logger("worker.llama")

DEFAULT_MAX_TOKENS = 2048  # the spec's default for max_completion_tokens


@dataclass
class Slot:
    seq: int
    req: Generate | None = None
    pending_prompt: list[int] = field(default_factory=list)
    n_past: int = 0
    n_prompt: int = 0
    n_gen: int = 0
    max_tokens: int = 0
    last_token: int = -1
    row: int = -1  # this step's output row in the batch, or -1
    sampler: Sampler | None = None
    text: TextStream | None = None
    started: float = 0.0
    n_cached: int = 0  # prompt tokens whose KV was reused from the previous turn
    # Tokens whose KV this slot holds, kept after a GenieX-KeepCache request so the
    # next turn of the same conversation only evaluates what is new.
    history: list[int] = field(default_factory=list)
    spec: SpecState | None = None  # set only for a request that speculates
    logprobs: list[TokenLogprob] | None = None  # tokens not yet sent, for a request that wants logprobs
    held: str = ""  # text waiting for the next Delta (see LlamaEngine._emit_text)
    last_emit: float = 0.0


@dataclass
class Queued:
    """A request accepted but not yet in a slot, with what submit() prepared for it (the
    sampler is built there so that a bad grammar is refused before the request queues)."""

    req: Generate
    tokens: list[int]
    sampler: Sampler
    reasoning_open: bool = False


class Slots:
    def __init__(self, mem: ctypes.c_void_p, parallel: int, nctx: int) -> None:
        self.mem = mem
        self.nctx = nctx
        self.slots = [Slot(seq=i) for i in range(parallel)]
        self.waiting: deque[Queued] = deque()

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.slots)

    def running(self) -> int:
        return sum(s.req is not None for s in self.slots)

    def free(self) -> list[Slot]:
        return [s for s in self.slots if s.req is None]

    def find(self, req_id: int) -> Slot | None:
        return next((s for s in self.slots if s.req is not None and s.req.req_id == req_id), None)

    def unqueue(self, req_id: int) -> Queued | None:
        for i, q in enumerate(self.waiting):
            if q.req.req_id == req_id:
                del self.waiting[i]
                return q
        return None

    def admit(self, emit: Emit, speculate: Callable[[Speculation], SpecState]) -> None:
        """Put waiting requests into free slots, and tell the gateway each one started."""
        while self.waiting:
            free = self.free()
            if not free:
                return
            q = self.waiting.popleft()
            req, tokens = q.req, q.tokens
            slot, reuse = self._pick(free, tokens, req.keep_cache)
            # Keep the KV of the shared prefix, drop the rest; at least one prompt
            # token must be evaluated so there are logits to sample from.
            reuse = min(reuse, len(tokens) - 1)
            L.llama_memory_seq_rm(self.mem, slot.seq, reuse, -1)
            slot.req = req
            slot.history = list(tokens)
            slot.pending_prompt = tokens[reuse:]
            slot.n_prompt = len(tokens)
            slot.n_cached = reuse
            slot.n_past = reuse
            slot.n_gen = 0
            wanted = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
            slot.max_tokens = max(1, min(wanted, self.nctx - len(tokens)))
            slot.sampler = q.sampler
            slot.text = TextStream(req.stop)
            slot.logprobs = [] if req.logprobs >= 0 else None
            if req.speculation is not None:
                slot.spec = speculate(req.speculation)
            slot.started = time.perf_counter()
            emit(Started(req.req_id, len(tokens), reuse, q.reasoning_open))
            log.debug("admitted", request_id=req.log_id, slot=slot.seq, prompt_tokens=len(tokens), reused_tokens=reuse,
                      keep_cache=req.keep_cache, waiting=len(self.waiting))  # fmt: skip

    @staticmethod
    def _pick(free: list[Slot], tokens: list[int], keep_cache: bool) -> tuple[Slot, int]:
        """A KeepCache request takes the free slot sharing the longest prefix; others take
        an empty slot if there is one, so that kept caches survive for their next turn."""
        if keep_cache:
            best, best_n = free[0], 0
            for slot in free:
                n = _common_prefix(slot.history, tokens)
                if n > best_n:
                    best, best_n = slot, n
            return best, best_n
        empty = [s for s in free if not s.history]
        return (empty or free)[0], 0

    def scratch(self) -> Slot | None:
        """A free slot whose KV may be used and cleared (for a logits pass), an empty one first."""
        free = self.free()
        if not free:
            return None
        slot = next((s for s in free if not s.history), free[0])
        L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
        slot.history = []
        return slot

    def release(self, slot: Slot) -> None:
        """Free the slot; its KV too, unless the request asked to keep it for the next turn."""
        if slot.sampler is not None:
            slot.sampler.free()
        keep = slot.req is not None and slot.req.keep_cache and not slot.pending_prompt
        if not keep:
            L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
            slot.history = []
        else:
            # The last sampled token was never decoded, so its KV does not exist.
            slot.history = slot.history[: slot.n_past]
        slot.req = None
        slot.sampler = None
        slot.text = None
        slot.logprobs = None
        slot.spec = None
        slot.held = ""
        slot.pending_prompt = []
        slot.row = -1

    def close(self) -> None:
        for slot in self.slots:
            if slot.req is not None:
                self.release(slot)
        for q in self.waiting:
            q.sampler.free()
        self.waiting.clear()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
