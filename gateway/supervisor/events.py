"""An in-process publish/subscribe hub for model and worker state changes (`GET /v1/events`).

Plain Python, no HTTP: the pool's handles publish (`EventHub.publish`, synchronous and cheap,
called on the event loop), each subscriber holds a bounded backlog. A subscriber that reads
slower than events come keeps only its newest `cap` events: the oldest are dropped and counted,
and its next read starts with a `Dropped(count)` marker, so its memory stays bounded and it knows
to re-read the state it missed.
"""

from __future__ import annotations

import asyncio
from collections import deque

from gateway.errors import Overloaded
from protocol.events import Dropped, Event

BACKLOG = 256  # events one subscriber may have waiting before its oldest are dropped
MAX_SUBSCRIBERS = 64


class Subscription:
    """One subscriber's backlog: at most `cap` events, and how many were dropped since its last read."""

    def __init__(self, cap: int) -> None:
        self.cap = max(1, cap)
        self.dropped = 0
        self.closed = False
        self._backlog: deque[Event] = deque()
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._backlog)

    def put(self, event: Event) -> None:
        if self.closed:
            return
        if len(self._backlog) >= self.cap:
            self._backlog.popleft()
            self.dropped += 1
        self._backlog.append(event)
        self._wake.set()

    def take(self) -> list[Event]:
        """What is waiting now (a `Dropped` marker first when events were lost), without waiting."""
        out: list[Event] = [Dropped(self.dropped)] if self.dropped else []
        out.extend(self._backlog)
        self._backlog.clear()
        self.dropped = 0
        self._wake.clear()
        return out

    async def next(self, timeout: float | None = None) -> list[Event]:
        """The waiting events, after waiting up to `timeout` seconds for one ([]: none came)."""
        if not self._backlog and not self.dropped and not self.closed:
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                return []
        return self.take()


class EventHub:
    def __init__(self, cap: int = BACKLOG, max_subscribers: int = MAX_SUBSCRIBERS) -> None:
        self.cap = cap
        self.max_subscribers = max_subscribers
        self._subscribers: list[Subscription] = []

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, event: Event) -> None:
        for sub in self._subscribers:
            sub.put(event)

    def subscribe(self) -> Subscription:
        if len(self._subscribers) >= self.max_subscribers:
            raise Overloaded(f"{self.max_subscribers} clients already follow the event stream; retry later",
                             retry_after=5)  # fmt: skip
        sub = Subscription(self.cap)
        self._subscribers.append(sub)
        return sub

    def close(self) -> None:
        """End every subscription (the server is draining: its streams must end for the drain to finish)."""
        for sub in list(self._subscribers):
            self.unsubscribe(sub)

    def unsubscribe(self, sub: Subscription) -> None:
        sub.closed = True
        sub._wake.set()
        if sub in self._subscribers:
            self._subscribers.remove(sub)
