"""Self-speculative drafters: guess the next tokens from the sequence's own history.

Both look for an earlier place where the text just written already appeared and
propose what followed it there. They are pure Python over token lists (no model),
so they can be tested without llama.cpp. A drafter belongs to one request: it
indexes `history` incrementally, so `history` must only ever grow between calls
(the engine passes prompt + accepted tokens, never unverified drafts).

The two differ in how they find the earlier place:

- `NgramSimple` searches the history for the most recent earlier occurrence of
  the last n tokens, trying the longest n first (4, then 3; a 2-token match drafts
  wrong more often than not on ordinary prose, and a wrong draft token costs about
  half a decoded token to verify on a CPU). The search
  is a byte `rfind` over the history packed as int32, so it costs O(history) per
  step but runs in C. It adapts its match length to the text and never proposes
  more than the history holds after the match.
- `NgramMapK` keeps a hash map from every k-gram (k = 3) to the position just
  after its latest occurrence, updated as tokens arrive: O(1) per step however
  long the history is, one fixed key length. When the copied run reaches the end
  of the history it looks the map up again with the tokens drafted so far, so a
  periodic text (a repeated list) yields drafts as long as `n_max`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Protocol

_INT = 4  # bytes per token in NgramSimple's packed history (array('i'))


class Drafter(Protocol):
    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        """Up to `n_max` tokens predicted to follow `history`; empty when there is no guess."""
        ...


class NgramSimple:
    def __init__(self, longest: int = 4, shortest: int = 3) -> None:
        assert 1 <= shortest <= longest
        self.longest = longest
        self.shortest = shortest
        self._packed = bytearray()
        self._seen = 0

    def _sync(self, history: Sequence[int]) -> None:
        if len(history) < self._seen:  # not expected; rebuild rather than search stale bytes
            self._packed.clear()
            self._seen = 0
        if len(history) > self._seen:
            self._packed += array("i", history[self._seen :]).tobytes()
            self._seen = len(history)

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        self._sync(history)
        h = len(history)
        packed = self._packed
        for n in range(min(self.longest, h - 1), self.shortest - 1, -1):
            key = bytes(packed[(h - n) * _INT :])
            # The occurrence must end before the last token, so that at least one token follows it.
            end = (h - 1) * _INT
            while True:
                at = packed.rfind(key, 0, end)
                if at < 0:
                    break
                if at % _INT == 0:  # a match across token boundaries is not a match
                    follow = at // _INT + n
                    return list(history[follow : follow + n_max])
                end = at + len(key) - 1
        return []


class NgramMapK:
    def __init__(self, k: int = 3) -> None:
        assert k >= 1
        self.k = k
        self._next: dict[tuple[int, ...], int] = {}  # k-gram -> index of the token after its latest occurrence
        self._seen = 0

    def _sync(self, history: Sequence[int]) -> None:
        k = self.k
        if len(history) < self._seen:
            self._next.clear()
            self._seen = 0
        # A k-gram is indexed once its follower is known: the one ending at the last token is not.
        for j in range(max(k, self._seen), len(history)):
            self._next[tuple(history[j - k : j])] = j
        self._seen = len(history)

    def draft(self, history: Sequence[int], n_max: int) -> list[int]:
        self._sync(history)
        k, h = self.k, len(history)
        if h < k:
            return []
        at = self._next.get(tuple(history[h - k :]))
        out: list[int] = []
        while at is not None and len(out) < n_max:
            if at < h:
                out.append(history[at])
                at += 1
                continue
            # Ran off the end: continue from where the last k tokens (history + draft) occurred.
            tail = (list(history[h - k :]) + out)[-k:]
            at = self._next.get(tuple(tail))  # always < h, so the loop copies again next turn
        return out


NGRAM_DRAFTERS = {"ngram-simple": NgramSimple, "ngram-map-k": NgramMapK}


def make_drafter(kind: str) -> Drafter:
    return NGRAM_DRAFTERS[kind]()
