"""A request's priority, and how long a lower one may wait behind a higher: the person at the
keyboard first (an editor's completion, a chat window), a background agent when they are done.

The gateway decides a request's priority (its API key's `priority=`, the `GenieX-Priority` header
within it, the models file's default: gateway/http/priority.py) and sends it with the request; the
chat engine orders its queue and its steps by it (workers/engines/llama/). Two bounds keep a
lower priority from starving:

- in the queue, a request rises one class for every AGING_S it has waited, so a background
  request is first in line after at most 2 x AGING_S, however much interactive work arrives;
- in the step, a background sequence paused because interactive work runs is paused at most
  MAX_PAUSE_S at a time: then it takes part in one step.
"""

from __future__ import annotations

from typing import Literal, get_args

Priority = Literal["interactive", "normal", "background"]
PRIORITIES: tuple[str, ...] = get_args(Priority)
RANK: dict[str, int] = {p: i for i, p in enumerate(PRIORITIES)}  # 0 first
DEFAULT: Priority = "normal"
HEADER = "GenieX-Priority"

AGING_S = 10.0
MAX_PAUSE_S = 2.0


def queue_rank(priority: str, waited_s: float) -> float:
    """Where a waiting request stands (lower goes first): its class, less one per AGING_S waited."""
    return max(0.0, RANK.get(priority, RANK[DEFAULT]) - waited_s / AGING_S)


def capped(asked: Priority, ceiling: Priority | None) -> Priority:
    """`asked`, but never above `ceiling` (an API key's priority: its holder may lower it, not raise it)."""
    if ceiling is not None and RANK[asked] < RANK[ceiling]:
        return ceiling
    return asked
