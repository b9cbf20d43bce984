"""Recent responses kept for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`.

In memory and bounded three ways: a count, an age, and the characters their conversations hold
(each entry keeps its whole conversation, so that a continuation needs no chain of entries that
eviction could break). The oldest go first; a restart forgets them all. Entries belong to the
caller that made them (the API key's label when the server has keys), so one key can neither
read nor continue nor delete another's responses.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from protocol import chat
from protocol import responses as r

MAX_RESPONSES = 1000
MAX_AGE_S = 3600.0
MAX_CHARS = 64 * 1024 * 1024  # the JSON of every stored conversation together


@dataclass(frozen=True, slots=True)
class Stored:
    response: r.Response
    conversation: list[chat.ChatMessage]  # input and output, without instructions: what a continuation reads
    at: float
    size: int


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_age_s: float = MAX_AGE_S,
                 max_chars: int = MAX_CHARS, clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.max_responses = max_responses
        self.max_age_s = max_age_s
        self.max_chars = max_chars
        self.clock = clock
        self._entries: OrderedDict[tuple[str, str], Stored] = OrderedDict()  # oldest first
        self.chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, owner: str, response: r.Response, conversation: list[chat.ChatMessage]) -> None:
        size = len(msgspec.json.encode(conversation)) + len(msgspec.json.encode(response))
        if size > self.max_chars:
            return  # larger than the whole store: keeping it would evict everything else
        key = (owner, response.id)
        self._drop(key)
        self._entries[key] = Stored(response, conversation, self.clock(), size)
        self.chars += size
        self._expire()
        while len(self._entries) > self.max_responses or self.chars > self.max_chars:
            self._drop(next(iter(self._entries)))

    def get(self, owner: str, response_id: str) -> Stored | None:
        self._expire()
        return self._entries.get((owner, response_id))

    def delete(self, owner: str, response_id: str) -> bool:
        self._expire()
        return self._drop((owner, response_id))

    def _drop(self, key: tuple[str, str]) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self.chars -= entry.size
        return True

    def _expire(self) -> None:
        """Entries are in the order they were stored, so the expired ones are at the front."""
        horizon = self.clock() - self.max_age_s
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.at > horizon:
                break
            self._drop(key)
