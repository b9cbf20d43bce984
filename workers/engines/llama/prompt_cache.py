"""Saved sequence states in host RAM: a conversation's KV outlives the slot that computed it.

An entry is a tenant, the tokens whose KV it holds, and llama.cpp's saved state of that sequence
(`llama_state_seq_get_data`). Restoring one into any slot (`llama_state_seq_set_data`) and cutting
it to the prefix a new prompt shares costs a copy, not a prefill. Entries are looked up by their
token prefix within one tenant only (a shared prefix across tenants would be a timing side channel),
evicted least recently used first under a byte cap, GenieX-KeepCache ("pinned") entries last.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import llama_cpp as L
import structlog

log = structlog.get_logger("worker.cache")

State = ctypes.Array[ctypes.c_uint8]


@dataclass
class Entry:
    tenant: str
    tokens: list[int]
    state: State
    pinned: bool = False
    used: float = field(default_factory=time.monotonic)

    @property
    def size(self) -> int:
        return len(self.state)


def save(ctx: ctypes.c_void_p, seq: int) -> State | None:
    """The saved state of sequence `seq` (None if llama.cpp cannot save it)."""
    size = L.llama_state_seq_get_size(ctx, seq)
    if size <= 0:
        return None
    buf = (ctypes.c_uint8 * size)()
    if L.llama_state_seq_get_data(ctx, buf, size, seq) != size:
        return None
    return buf


def restore(ctx: ctypes.c_void_p, mem: ctypes.c_void_p, state: State, seq: int) -> bool:
    """Replace sequence `seq`'s KV with a saved state; False (and `seq` empty) if it did not load."""
    L.llama_memory_seq_rm(mem, seq, -1, -1)
    if L.llama_state_seq_set_data(ctx, state, len(state), seq) == 0:
        L.llama_memory_seq_rm(mem, seq, -1, -1)
        return False
    return True


class PromptCache:
    def __init__(self, cap_bytes: int, spill: Callable[[Entry], object] | None = None) -> None:
        """`spill`: given each entry evicted for room (the disk tier keeps it)."""
        self.cap = max(0, cap_bytes)
        self.entries: list[Entry] = []
        self.bytes = 0
        self.evictions = 0
        self._spill = spill

    def best(self, tenant: str, tokens: list[int]) -> tuple[Entry | None, int]:
        """The entry of `tenant` sharing the longest token prefix with `tokens`, and that length."""
        best, best_n = None, 0
        for e in self.entries:
            if e.tenant == tenant:
                n = common_prefix(e.tokens, tokens)
                if n > best_n:
                    best, best_n = e, n
        if best is not None:
            best.used = time.monotonic()
        return best, best_n

    def put(self, tenant: str, tokens: list[int], state: State, pinned: bool = False) -> bool:
        """Keep a state; entries of the same tenant whose tokens it extends go (it holds them too)."""
        if len(state) > self.cap:
            return False
        for e in [e for e in self.entries if e.tenant == tenant and common_prefix(e.tokens, tokens) == len(e.tokens)]:
            pinned = pinned or e.pinned
            self._drop(e)
        self.entries.append(Entry(tenant, list(tokens), state, pinned))
        self.bytes += len(state)
        while self.bytes > self.cap:
            victim = min(self.entries, key=lambda e: (e.pinned, e.used))
            log.debug("cache eviction", tokens=len(victim.tokens), bytes=victim.size, pinned=victim.pinned)
            self._drop(victim)
            self.evictions += 1
            if self._spill is not None:
                self._spill(victim)
        return True

    def _drop(self, e: Entry) -> None:
        self.entries.remove(e)
        self.bytes -= e.size


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
