"""The chat engine's sequence slots: who waits, who runs in which KV sequence, what each keeps.

A request waits in `Slots.waiting` (already tokenized, its sampler built) until a slot is free.
In a slot it goes FREE -> PREFILL -> DECODE -> FREE (`SlotState`); everything it brings lives in
one `Run` that `Slot.reset` drops whole, so no field of it outlives the request, and only the
slot's KV (`history` and its tags) is left for the next one.
Prompt caching, automatic and per tenant (`Generate.cache_key`):

- A slot whose request completed keeps its KV, tagged with the request's tenant. A cancelled or
  failed request leaves nothing: its slot is cleared.
- `admit` finds the longest token prefix the request may reuse: in a free slot of its tenant
  (reused in place), in any other slot of its tenant, or in the RAM cache (`prompt_cache.py`)
  (copied into the slot as a saved state). It keeps that prefix's KV and evaluates the rest.
- Before a slot's kept KV is cut or overwritten, it is saved to the RAM cache, so a
  conversation survives its slot being taken by another.
- Under the RAM cache, the disk tier (`disk_cache.py`): what the RAM cache evicts, and at close
  what the slots and the RAM cache still hold, is written there, and `admit` restores from it too,
  so a conversation survives its worker (an idle stop, an eviction, a restart).
"""

from __future__ import annotations

import ctypes
import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import llama_cpp as L
import structlog

from protocol.wire import Generate, Speculation, Started, TokenLogprob
from workers.engines import Emit
from workers.engines.llama import prompt_cache
from workers.engines.llama.disk_cache import DiskCache, DiskEntry
from workers.engines.llama.draft_model import SpecState
from workers.engines.llama.media import MediaPrompt, whole_media
from workers.engines.llama.prompt_cache import PromptCache, common_prefix
from workers.engines.llama.sampling import Sampler
from workers.engines.llama.schedule import BACKGROUND, next_waiting
from workers.engines.llama.text_stream import TextStream
from workers.engines.llama.think_budget import ThinkBudget

log = structlog.get_logger("worker.llama")

DEFAULT_MAX_TOKENS = 2048  # the spec's default for max_completion_tokens
# Copying a saved state costs a memory copy of its whole KV (a few ms for thousands of tokens of a
# small model), prefilling costs a forward pass per token: a copy pays off from a few tokens on.
MIN_COPY_TOKENS = 16
# Conversations shorter than this are not worth a place in the RAM cache.
MIN_SAVE_TOKENS = 64


class SlotState(enum.Enum):
    """Where a slot's request is. The step puts a PREFILL slot's prompt chunks and a DECODE slot's
    last token in its batch, and samples a slot only once it is in DECODE."""

    FREE = "free"  # no request; the KV of the last one may stay for its tenant (`Slot.cacheable`)
    PREFILL = "prefill"  # prompt keys not yet in the KV (text chunks, or an image next)
    DECODE = "decode"  # generating: one token (plus a draft) per step


# A request always goes through PREFILL (at least one prompt token is evaluated, for logits to
# sample from), and may leave from either phase: cancelled or failed while prefilling, or done.
_NEXT: dict[SlotState, frozenset[SlotState]] = {
    SlotState.FREE: frozenset({SlotState.PREFILL}),
    SlotState.PREFILL: frozenset({SlotState.DECODE, SlotState.FREE}),
    SlotState.DECODE: frozenset({SlotState.FREE}),
}


class SlotStateError(RuntimeError):
    """A slot was asked to change state in a way its lifecycle does not allow (an engine bug: a
    second release would free a sampler twice)."""


@dataclass
class Run:
    """What a slot holds for the request it serves, dropped whole when the request leaves so
    that nothing of it can leak into the next one."""

    req: Generate
    sampler: Sampler
    text: TextStream
    pending_prompt: list[int]  # prompt keys not yet in the KV
    n_prompt: int
    n_cached: int  # prompt tokens whose KV was reused from a previous turn
    n_past: int  # positions of this sequence in the KV (valid up to what is decoded)
    max_tokens: int
    started: float
    media: MediaPrompt | None = None  # the images of the prompt (llama/media.py)
    spec: SpecState | None = None  # set only for a request that speculates
    logprobs: list[TokenLogprob] | None = None  # tokens not yet sent, for a request that wants logprobs
    think: ThinkBudget | None = None  # its thinking section (chat requests)
    inject: list[int] = field(default_factory=list)  # tokens the next step puts after last_token, unsampled
    n_gen: int = 0
    last_token: int = -1
    row: int = -1  # this step's output row in the batch, or -1
    paused_since: float | None = None  # sitting steps out behind interactive work (llama/schedule.py)
    held: str = ""  # text waiting for the next Delta (see LlamaEngine._emit_text)
    last_emit: float = 0.0

    @property
    def priority(self) -> str:
        return self.req.priority


@dataclass
class Slot:
    """One KV sequence. Its state and its `Run` change only through `start`, `feed` and `reset`;
    the other fields describe the KV it keeps across requests, and are `Slots`' to manage."""

    seq: int
    # Tokens whose KV this slot holds, kept after a request so that the next turn of the same
    # conversation only evaluates what is new.
    history: list[int] = field(default_factory=list)
    # Whose that KV is, whether a completed request that allows caching left it, whether
    # GenieX-KeepCache asked to keep it, and when it was last used.
    tenant: str = ""
    cacheable: bool = False
    pinned: bool = False
    used: float = 0.0
    state: SlotState = field(default=SlotState.FREE, init=False)
    _run: Run | None = field(default=None, init=False, repr=False)

    @property
    def run(self) -> Run:
        """The request this slot serves; only a busy slot has one."""
        if self._run is None:
            raise SlotStateError(f"slot {self.seq} is free: it has no request")
        return self._run

    def start(self, run: Run) -> None:
        if not run.pending_prompt:
            raise SlotStateError(f"slot {self.seq}: a request starts with at least one prompt token to evaluate")
        self._move(SlotState.PREFILL)
        self._run = run

    def feed(self, n: int) -> list[int]:
        """The next `n` prompt keys, taken off the pending prompt. Taking the prompt's last key
        ends PREFILL: its logits, after this step's decode, give the first token."""
        if self.state is not SlotState.PREFILL:
            raise SlotStateError(f"slot {self.seq} is {self.state.value}: it has no prompt to feed")
        run = self.run
        chunk, run.pending_prompt = run.pending_prompt[:n], run.pending_prompt[n:]
        if not run.pending_prompt:
            self._move(SlotState.DECODE)
        return chunk

    def reset(self) -> None:
        """The request leaves: its native sampler and images are freed, and the slot is FREE again.
        What stays of its KV is decided by `Slots.release` before."""
        self._move(SlotState.FREE)
        run, self._run = self._run, None
        assert run is not None
        run.sampler.free()
        if run.media is not None:
            run.media.free()

    def _move(self, to: SlotState) -> None:
        if to not in _NEXT[self.state]:
            raise SlotStateError(f"slot {self.seq}: no transition from {self.state.value} to {to.value}")
        self.state = to


@dataclass
class Queued:
    """A request accepted but not yet in a slot, with what submit() prepared for it (the
    sampler is built there so that a bad grammar is refused before the request queues)."""

    req: Generate
    tokens: list[int]
    sampler: Sampler
    reasoning_open: bool = False
    media: MediaPrompt | None = None  # a prompt with images: its keys are `tokens`
    think: ThinkBudget | None = None
    queued_at: float = field(default_factory=time.monotonic)

    @property
    def priority(self) -> str:
        return self.req.priority


class Slots:
    def __init__(self, ctx: ctypes.c_void_p, mem: ctypes.c_void_p, parallel: int, nctx: int, cache_bytes: int,
                 disk: DiskCache | None = None) -> None:  # fmt: skip
        self.ctx = ctx
        self.mem = mem
        self.nctx = nctx
        self.slots = [Slot(seq=i) for i in range(parallel)]
        self.waiting: deque[Queued] = deque()
        self.disk = disk if disk is not None and disk.cap else None
        spill = self.disk
        self.cache = PromptCache(cache_bytes, spill=(lambda e: spill.put(e.tenant, e.tokens, e.state, e.pinned))
                                 if spill is not None else None)  # fmt: skip

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.slots)

    def running(self) -> int:
        return sum(s.state is not SlotState.FREE for s in self.slots)

    def free(self) -> list[Slot]:
        return [s for s in self.slots if s.state is SlotState.FREE]

    def find(self, req_id: int) -> Slot | None:
        return next((s for s in self.slots if s.state is not SlotState.FREE and s.run.req.req_id == req_id), None)

    def unqueue(self, req_id: int) -> Queued | None:
        for i, q in enumerate(self.waiting):
            if q.req.req_id == req_id:
                del self.waiting[i]
                return q
        return None

    def admit(self, emit: Emit, speculate: Callable[[Speculation], SpecState]) -> None:
        """Put waiting requests into free slots, best rank first (llama/schedule.py), and tell the
        gateway each one started."""
        while self.waiting:
            free = self.free()
            if not free:
                return
            background = sum(s.state is not SlotState.FREE and s.run.priority == BACKGROUND for s in self.slots)
            i = next_waiting(self.waiting, time.monotonic(), parallel=len(self.slots), busy_background=background)
            if i is None:
                return  # only background requests wait, and they hold every slot they may
            q = self.waiting[i]
            del self.waiting[i]
            req, tokens = q.req, q.tokens
            slot, reuse = self._place(free, req, tokens)
            self._log(req, slot, len(tokens), reuse)
            slot.history = list(tokens)
            slot.tenant = req.cache_key
            slot.cacheable = False
            slot.pinned = req.keep_cache
            wanted = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
            n_prompt = q.media.n_tokens if q.media is not None else len(tokens)
            slot.start(Run(req, q.sampler, TextStream(req.stop), pending_prompt=tokens[reuse:], n_prompt=n_prompt,
                           n_cached=reuse, n_past=reuse, max_tokens=max(1, min(wanted, self.nctx - len(tokens))),
                           started=time.perf_counter(), media=q.media,
                           spec=speculate(req.speculation) if req.speculation is not None else None,
                           logprobs=[] if req.logprobs >= 0 else None, think=q.think))  # fmt: skip
            d = self.disk
            emit(Started(req.req_id, n_prompt, reuse, q.reasoning_open, self.cache.bytes, self.cache.evictions,
                         *((d.bytes, d.stats.hits, d.stats.evictions, d.stats.write_errors) if d else ())))  # fmt: skip

    def _place(self, free: list[Slot], req: Generate, tokens: list[int]) -> tuple[Slot, int]:
        """The slot for this prompt and how many of its tokens already have KV there: the longest
        prefix of its tenant's, in place in a free slot or copied from another slot or the cache."""
        # At least one prompt token must be evaluated, so that there are logits to sample from.
        limit = len(tokens) - 1
        own = [s for s in free if s.cacheable and s.tenant == req.cache_key] if req.cache else []
        # A reused prefix never ends inside an image (whole_media): half an image's KV is no use.
        in_place, n_in = max(((s, whole_media(tokens, min(common_prefix(s.history, tokens), limit))) for s in own),
                             key=lambda c: c[1], default=(None, 0))  # fmt: skip
        source: Slot | prompt_cache.Entry | DiskEntry | None = None
        n_copy = 0
        if req.cache:
            for s in self.slots:
                busy = s.state is not SlotState.FREE
                if s is not in_place and s.tenant == req.cache_key and (s.cacheable or busy):
                    # A busy slot's KV is valid up to what it has decoded; a free one's is its history.
                    valid = s.run.n_past if busy else len(s.history)
                    n = whole_media(tokens, min(common_prefix(s.history, tokens), valid, limit))
                    if n > n_copy:
                        source, n_copy = s, n
            entry, n = self.cache.best(req.cache_key, tokens)
            n = whole_media(tokens, min(n, limit))
            if n > n_copy:
                source, n_copy = entry, n
            if self.disk is not None:
                on_disk, n = self.disk.best(req.cache_key, tokens)
                n = whole_media(tokens, min(n, limit))
                if n > n_copy and n >= MIN_COPY_TOKENS:
                    source, n_copy = on_disk, n
        if in_place is not None and n_in + MIN_COPY_TOKENS > n_copy:
            self._keep(in_place, n_in)
            L.llama_memory_seq_rm(self.mem, in_place.seq, n_in, -1)
            return in_place, n_in
        slot = min(free, key=lambda s: (bool(s.history), s.pinned, s.used))  # empty first, then unpinned LRU
        self._keep(slot, 0)
        reuse = n_copy if n_copy >= MIN_COPY_TOKENS and self._copy(source, slot) else 0
        L.llama_memory_seq_rm(self.mem, slot.seq, reuse, -1)
        return slot, reuse

    def _keep(self, slot: Slot, kept: int) -> None:
        """Before a slot's kept KV is cut to `kept` tokens: save the whole of it to the RAM cache
        (or, without one or past its size, to the disk tier)."""
        if slot.cacheable and len(slot.history) - kept >= MIN_SAVE_TOKENS and (self.cache.cap or self.disk):
            state = prompt_cache.save(self.ctx, slot.seq)
            if state is not None and not self.cache.put(slot.tenant, slot.history, state, slot.pinned) and self.disk:
                self.disk.put(slot.tenant, slot.history, state, slot.pinned)
        slot.cacheable = False

    def _copy(self, source: Slot | prompt_cache.Entry | DiskEntry | None, slot: Slot) -> bool:
        if source is None:
            return False
        if isinstance(source, DiskEntry):
            state = self.disk.load(source) if self.disk is not None else None
        elif isinstance(source, prompt_cache.Entry):
            state = source.state
        else:
            state = prompt_cache.save(self.ctx, source.seq)
        return state is not None and prompt_cache.restore(self.ctx, self.mem, state, slot.seq)

    def _log(self, req: Generate, slot: Slot, prompt_tokens: int, reuse: int) -> None:
        log.debug("admitted", request_id=req.log_id, slot=slot.seq, prompt_tokens=prompt_tokens, reused_tokens=reuse,
                  cache_entries=len(self.cache.entries), cache_bytes=self.cache.bytes,
                  waiting=len(self.waiting))  # fmt: skip

    def scratch(self) -> Slot | None:
        """A free slot whose KV may be used and cleared (for a logits pass), the least valuable first."""
        free = self.free()
        if not free:
            return None
        slot = min(free, key=lambda s: (bool(s.history), s.pinned, s.used))
        self._keep(slot, 0)
        L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
        slot.history = []
        return slot

    def release(self, slot: Slot, completed: bool) -> None:
        """Free the slot. A completed request that allows caching leaves its KV for the next one
        of its tenant; anything else leaves nothing."""
        run = slot.run
        if completed and run.req.cache and slot.state is SlotState.DECODE:
            # The last sampled token was never decoded, so its KV does not exist.
            slot.history = slot.history[: run.n_past]
            slot.cacheable = True
        else:
            L.llama_memory_seq_rm(self.mem, slot.seq, -1, -1)
            slot.history = []
            slot.cacheable = False
        slot.used = time.monotonic()
        slot.reset()

    def close(self) -> None:
        for slot in self.slots:
            if slot.state is not SlotState.FREE:
                self.release(slot, completed=False)
        if self.disk is not None:
            self._spill_all(self.disk)
        for q in self.waiting:
            q.sampler.free()
            if q.media is not None:
                q.media.free()
        self.waiting.clear()

    def _spill_all(self, disk: DiskCache) -> None:
        """The worker is going: what its free slots and RAM cache hold goes to disk, the most
        recently used first (if the time to write runs out, the oldest are what is lost), each
        ranked for the disk tier's eviction by when it was last used."""
        t0 = time.perf_counter()
        kept: list[tuple[float, str, list[int], prompt_cache.State, bool]] = []
        for slot in self.slots:
            if slot.cacheable and len(slot.history) >= MIN_SAVE_TOKENS:
                state = prompt_cache.save(self.ctx, slot.seq)
                if state is not None:
                    kept.append((slot.used, slot.tenant, slot.history, state, slot.pinned))
        kept += [(e.used, e.tenant, e.tokens, e.state, e.pinned) for e in self.cache.entries]
        now = time.monotonic()
        for used, tenant, tokens, state, pinned in sorted(kept, key=lambda k: -k[0]):
            disk.put(tenant, tokens, state, pinned, age_s=max(0.0, now - used))
        disk.close()
        if kept:
            log.info("prompt states saved to disk", states=len(kept), ms=round((time.perf_counter() - t0) * 1000, 1),
                     write_errors=disk.stats.write_errors)  # fmt: skip
