"""`truncation: "auto"`: which messages of a conversation that outgrows the context may be dropped,
in which order, and how many must go. Pure functions, shared by the worker (which measures the
prompt in real tokens, docs/api.md "Context overflow") and the gateway (which bounds the text
it lets through before anything is tokenized).

The policy, over the messages' roles:

- The pinned prefix stays: the system and developer messages the conversation starts with.
- The last user message stays, and so does the last group after it (the turn being answered:
  the assistant's latest tool call and its results).
- What may go, oldest first: before the last user message, whole turns (a user message and every
  message up to the next user message), so that what stays still alternates user / assistant as
  strict templates demand; after it, rounds (an assistant message and the tool results that follow
  it). A tool call is never parted from its results: both are in one group.
- Groups go, oldest first, until the prompt fits the context minus the room kept for the answer
  (`budget`); if it does not fit even with every group gone, every group goes, and the worker
  serves the rest if it fits the context at all (else the request is the usual 400).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import msgspec

Truncation = Literal["disabled", "auto"]
TRUNCATIONS: tuple[Truncation, ...] = ("disabled", "auto")


class Truncated(msgspec.Struct):
    """What `truncation: auto` dropped for a conversation to fit the context (a GenieX extension
    field of the answer): its oldest messages, and the prompt tokens they took."""

    messages: int
    tokens: int


PINNED_ROLES = frozenset({"system", "developer"})
RESULT_ROLES = frozenset({"tool", "function"})


def budget(nctx: int, max_tokens: int | None) -> int:
    """The prompt tokens a conversation may keep: the context, less room for the answer, which is
    `max_tokens` but at most a quarter of the context (a quarter when the request sets none)."""
    quarter = nctx // 4
    room = quarter if max_tokens is None else min(max_tokens, quarter)
    return nctx - max(1, room)


def groups(roles: Sequence[str | None]) -> list[range]:
    """The droppable groups of a conversation with these roles, as index ranges, oldest first (the
    module's docstring); an empty list when nothing may go."""
    n = len(roles)
    start = 0
    while start < n and roles[start] in PINNED_ROLES:
        start += 1
    last_user = next((i for i in range(n - 1, start - 1, -1) if roles[i] == "user"), None)
    out: list[range] = []
    if last_user is not None:
        i = start
        while i < last_user:  # whole turns before the last user message
            j = i + 1
            while j < last_user and roles[j] != "user":
                j += 1
            out.append(range(i, j))
            i = j
        start = last_user + 1
    rounds: list[range] = []
    i = start
    while i < n:  # rounds after it: a message and the tool results that follow it
        j = i + 1
        while j < n and roles[j] in RESULT_ROLES:
            j += 1
        rounds.append(range(i, j))
        i = j
    return out + rounds[:-1]  # the last round is the one being answered


def kept(n_messages: int, drop: Sequence[range], k: int) -> list[int]:
    """The indices of the messages that stay once the first `k` groups of `drop` are gone."""
    gone = {i for g in drop[:k] for i in g}
    return [i for i in range(n_messages) if i not in gone]


def least_k(sizes: Sequence[int], drop: Sequence[range], limit: int) -> int:
    """The fewest groups to drop before the messages' `sizes` (characters, say) sum to `limit` or
    less; len(drop) when even dropping all of them leaves more."""
    total = sum(sizes)
    for k, g in enumerate(drop):
        if total <= limit:
            return k
        total -= sum(sizes[i] for i in g)
    return len(drop)


def fit(n_groups: int, measure: Callable[[int], int], limit: int, lo: int = 0) -> int:
    """The fewest groups to drop (at least `lo`) for `measure(k)`, the prompt's tokens once the
    first k groups are gone, to be `limit` or less; `n_groups` when no k is enough. Binary search:
    dropping more never lengthens a prompt, so about log2(n_groups) prompts are measured."""
    lo = min(max(lo, 0), n_groups)
    hi = n_groups
    if measure(hi) > limit:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if measure(mid) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return hi


def message_chars(m: dict[str, Any]) -> int:
    """The text a message (a chat message as a dict, as the worker gets it) carries: a lower bound
    on its share of the rendered prompt."""
    content = m.get("content")
    if isinstance(content, str):
        n = len(content)
    elif isinstance(content, list):
        n = sum(len(str(p.get("text") or "")) for p in content if isinstance(p, dict))
    else:
        n = 0
    n += len(str(m.get("reasoning_content") or ""))
    for call in m.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            n += len(str(fn.get("arguments") or ""))
    return n


def image_parts(m: dict[str, Any]) -> int:
    """How many `{"type": "image"}` parts a message holds (its images travel beside the messages)."""
    content = m.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image")
