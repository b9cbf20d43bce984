"""Who goes first in the chat engine: requests by priority (protocol/priority.py), so that the
person at the keyboard is not kept waiting by a background agent's long prompt.

- The queue: the waiting request with the best rank goes into the next free slot, its rank its
  class less one per AGING_S it has waited (so a background request is never passed over for
  longer than 2 x AGING_S), arrival breaking ties. With two slots or more, background requests
  hold at most all but one, so an interactive or normal request always finds a slot free without
  waiting for an agent's generation to end.
- The step: while an interactive sequence runs (prefilling or generating), background sequences
  are paused: their prompt chunks and their next tokens wait, their KV and sampler stay as they
  are, and nothing is dropped. A paused sequence takes part in one step every MAX_PAUSE_S.
- Prompt chunks fill the batch in priority order, interactive first, and a background prompt's
  chunk is at most BACKGROUND_CHUNK tokens: a step cannot be interrupted, so the person's request
  that arrives during one waits for it to end, and on a CPU a 512-token step of a 1B model is
  seconds where a 128-token one is a quarter of that, for about the same prefill rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from protocol.priority import MAX_PAUSE_S, RANK, queue_rank

BACKGROUND = "background"
INTERACTIVE = "interactive"
BACKGROUND_CHUNK = 128


class Waiting(Protocol):
    @property
    def priority(self) -> str: ...
    @property
    def queued_at(self) -> float: ...


def next_waiting(waiting: Sequence[Waiting], now: float, *, parallel: int, busy_background: int) -> int | None:
    """The index of the waiting request to admit into a free slot now, or None (only background
    requests wait, and they hold every slot they may)."""
    background_full = parallel > 1 and busy_background >= parallel - 1
    best: tuple[float, int] | None = None
    for i, q in enumerate(waiting):
        if background_full and q.priority == BACKGROUND:
            continue
        rank = (queue_rank(q.priority, now - q.queued_at), i)
        if best is None or rank < best:
            best = rank
    return best[1] if best is not None else None


class Paused(Protocol):
    """What the step needs of a busy slot's request."""

    @property
    def priority(self) -> str: ...

    paused_since: float | None


def paused(runs: Iterable[Paused], now: float) -> set[int]:
    """The positions (in `runs`, the busy slots' requests) of the sequences that sit this step out."""
    runs = list(runs)
    if not any(r.priority == INTERACTIVE for r in runs):
        for r in runs:
            r.paused_since = None
        return set()
    out = set()
    for i, r in enumerate(runs):
        if r.priority != BACKGROUND:
            continue
        if r.paused_since is None or now - r.paused_since < MAX_PAUSE_S:
            if r.paused_since is None:
                r.paused_since = now
            out.add(i)
        else:
            r.paused_since = now  # its one step; paused again from here
    return out


def by_rank(priority: str) -> int:
    return RANK.get(priority, RANK["normal"])


def chunk_limit(priority: str, room: int) -> int:
    """How many prompt tokens a sequence of `priority` may put in this step's batch, of `room` left."""
    return min(room, BACKGROUND_CHUNK) if priority == BACKGROUND else room
