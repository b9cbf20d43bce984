"""A request's deadline (`--request-timeout-s`, a key's `timeout=`): set once per request by
gateway/http/deadline.py, read wherever the request waits (for its worker to load, in the worker's
queue, for each message of its answer). Past it the wait raises DeadlineExceeded, a GenieXError:
a 504 before the first byte, the route's own error event in a stream, and the request cancelled
on its worker by the path every early exit takes.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable
from typing import TypeVar

from gateway.errors import DeadlineExceeded

T = TypeVar("T")

# (monotonic time it ends, its length in seconds); None: no deadline
DEADLINE: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar("deadline", default=None)


def start(limit_s: float) -> contextvars.Token[tuple[float, float] | None]:
    return DEADLINE.set((time.monotonic() + limit_s, limit_s))


def remaining() -> float | None:
    d = DEADLINE.get()
    return None if d is None else d[0] - time.monotonic()


def exceeded() -> DeadlineExceeded:
    d = DEADLINE.get()
    limit = f"{d[1]:g} s" if d is not None else "its time"
    return DeadlineExceeded(f"the request took longer than its limit of {limit} (--request-timeout-s, or the API "
                            "key's timeout); it was cancelled", code="request_timeout")  # fmt: skip


def within(work: Awaitable[T]) -> Awaitable[T]:
    """`work`, to be awaited no longer than the request's deadline. Without one it is `work`
    itself: a stream awaits this per message, and most requests have no deadline."""
    d = DEADLINE.get()
    return work if d is None else _bounded(work, d[0])


async def _bounded(work: Awaitable[T], until: float) -> T:
    scope = asyncio.timeout_at(until)  # the loop's clock is time.monotonic()
    try:
        async with scope:
            return await work
    except TimeoutError:
        if scope.expired():
            raise exceeded() from None
        raise
