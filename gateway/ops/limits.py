"""Per-key limits: requests per minute, tokens per minute and concurrent requests (and a key's own
request deadline, `timeout`, which gateway/http/deadline.py applies).

Each limit is a one-minute sliding window (or a live count, for concurrency) kept per key label,
in memory: a restart forgives everyone, which suits a local server. Tokens are counted when a
request finishes (prompt plus completion), so a request is admitted while the key's last minute
is under its token limit and may end above it; the next one then waits until enough of that
minute has passed. A refusal names the limit and says when to come back (`Retry-After`).

A request over its key's concurrency first waits a moment (`CONCURRENT_GRACE_S`) for one of the
key's requests to end: a client may send its next request as soon as it has read the last one's
end (the OpenAI SDK closes a stream at its `[DONE]`), before the server has finished closing it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW_S = 60.0
NAMES = ("rpm", "tpm", "concurrent", "timeout")
CONCURRENT_GRACE_S = 0.25


@dataclass(frozen=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    concurrent: int | None = None
    timeout: int | None = None  # seconds a request of the key may take (gateway/http/deadline.py), not a rate

    @property
    def any(self) -> bool:
        """Whether any rate or concurrency limit is set (what the limiter counts)."""
        return self.rpm is not None or self.tpm is not None or self.concurrent is not None

    @classmethod
    def parse(cls, words: list[str]) -> Limits:
        """`rpm=60 tpm=20000 concurrent=2`, any subset; ValueError naming the bad word otherwise."""
        values: dict[str, int] = {}
        for word in words:
            name, sep, value = word.partition("=")
            if not sep or name not in NAMES:
                raise ValueError(f"{word!r} is not a limit; limits are {', '.join(n + '=N' for n in NAMES)}")
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{word!r}: a limit is a whole number of at least 1")
            values[name] = int(value)
        return cls(**values)


@dataclass(frozen=True)
class Refusal:
    limit: str  # rpm, tpm or concurrent
    allowed: int
    retry_after_s: int

    def message(self) -> str:
        what = {"rpm": "requests per minute", "tpm": "tokens per minute", "concurrent": "concurrent requests"}
        return f"rate limit reached for this API key: {self.limit} ({what[self.limit]}) is {self.allowed}"


@dataclass
class _Usage:
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    tokens_in_window: int = 0
    inflight: int = 0
    refused: dict[str, int] = field(default_factory=dict)


class KeyLimiter:
    """The live counts behind every key's limits; one per server, used on the event loop only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._usage: dict[str, _Usage] = {}
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # requests waiting out the grace, per key

    def _expire(self, u: _Usage, now: float) -> None:
        while u.requests and u.requests[0] <= now - WINDOW_S:
            u.requests.popleft()
        while u.tokens and u.tokens[0][0] <= now - WINDOW_S:
            u.tokens_in_window -= u.tokens.popleft()[1]

    def admit(self, label: str, limits: Limits) -> Refusal | None:
        """Count a request in, or say which limit refuses it. An admitted request is `release`d once."""
        refusal = self._try(label, limits)
        if refusal is not None:
            self._refused(label, refusal)
        return refusal

    async def enter(self, label: str, limits: Limits, grace_s: float = CONCURRENT_GRACE_S) -> Refusal | None:
        """`admit`, except that a request refused for concurrency alone first waits up to `grace_s`
        for one of its key's requests to be `release`d."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while (refusal := self._try(label, limits)) is not None:
            left = deadline - loop.time()
            if refusal.limit != "concurrent" or left <= 0:
                break
            freed = loop.create_future()
            waiting = self._waiting.setdefault(label, deque())
            waiting.append(freed)
            try:
                async with asyncio.timeout(left):
                    await freed
            except TimeoutError:
                pass
            finally:
                waiting.remove(freed)
                if not waiting:
                    del self._waiting[label]
        if refusal is not None:
            self._refused(label, refusal)
        return refusal

    def _refused(self, label: str, refusal: Refusal) -> None:
        u = self._usage[label]
        u.refused[refusal.limit] = u.refused.get(refusal.limit, 0) + 1

    def _try(self, label: str, limits: Limits) -> Refusal | None:
        now = self._clock()
        u = self._usage.setdefault(label, _Usage())
        self._expire(u, now)
        refusal = None
        if limits.concurrent is not None and u.inflight >= limits.concurrent:
            refusal = Refusal("concurrent", limits.concurrent, 1)
        elif limits.rpm is not None and len(u.requests) >= limits.rpm:
            # the oldest request in the window leaves it first
            refusal = Refusal("rpm", limits.rpm, _seconds(u.requests[-limits.rpm] + WINDOW_S - now))
        elif limits.tpm is not None and u.tokens_in_window >= limits.tpm:
            excess, at = u.tokens_in_window - limits.tpm, now
            for at, n in u.tokens:  # noqa: B007 - `at` is read after the loop
                excess -= n
                if excess < 0:
                    break
            refusal = Refusal("tpm", limits.tpm, _seconds(at + WINDOW_S - now))
        if refusal is not None:
            return refusal
        u.requests.append(now)
        u.inflight += 1
        return None

    def release(self, label: str) -> None:
        u = self._usage.get(label)
        if u is not None and u.inflight > 0:
            u.inflight -= 1
            for freed in self._waiting.get(label, ()):
                if not freed.done():
                    freed.set_result(None)  # the first still waiting tries again
                    break

    def spend(self, label: str, tokens: int) -> None:
        """A finished request's prompt and completion tokens, counted against the key's minute; only
        keys this limiter has admitted are counted (so nothing grows with callers it never saw)."""
        u = self._usage.get(label)
        if u is None or tokens <= 0:
            return
        u.tokens.append((self._clock(), tokens))
        u.tokens_in_window += tokens

    def snapshot(self) -> dict[str, tuple[int, int, int, dict[str, int]]]:
        """label -> (requests in the last minute, tokens in the last minute, in flight, refusals by limit)."""
        now = self._clock()
        out = {}
        for label, u in self._usage.items():
            self._expire(u, now)
            out[label] = (len(u.requests), u.tokens_in_window, u.inflight, dict(u.refused))
        return out


def _seconds(s: float) -> int:
    return max(1, math.ceil(s))
