"""Claims on workers: the one record of requests handed a worker (or waiting for its start) that it
has not yet admitted. While a worker has any, it is not idle, so neither an eviction nor the idle
reaper stops it between the hand-out and the admission (the request's handler awaits in between).
The pool owns the one instance; its handles release a claim as a request reaches them."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from protocol.keys import WorkerKey

# A claim never admitted, its request having failed first, lapses after this long.
CLAIM_S = 5.0


class Claims:
    def __init__(self, lapse_s: float = CLAIM_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.lapse_s = lapse_s
        self._clock = clock
        self._held: dict[WorkerKey, deque[float]] = {}

    def hold(self, key: WorkerKey, n: int = 1) -> None:
        """`n` requests were handed the worker for `key`, or wait for it to start."""
        if n > 0:
            self._held.setdefault(key, deque()).extend([self._clock()] * n)

    def release(self, key: WorkerKey) -> None:
        """One request reached its worker (admitted or refused), or its worker's start failed."""
        times = self._held.get(key)
        if times:
            times.popleft()
        if not times:
            self._held.pop(key, None)

    def held(self, key: WorkerKey) -> int:
        """Claims on `key` that have not lapsed."""
        times = self._held.get(key)
        if times is None:
            return 0
        lapsed = self._clock() - self.lapse_s
        while times and times[0] < lapsed:
            times.popleft()
        if not times:
            del self._held[key]
        return len(times)
