"""Cancel work whose client has gone away, for responses that are not streams.

A stream notices a disconnect when its next write fails (Litestar cancels it);
a request that is still computing its one JSON body has no write to fail, so
we watch the ASGI receive channel for `http.disconnect` while it works.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import structlog
from litestar import Request

from gateway.errors import ClientGone

log = structlog.get_logger("gateway.http")

T = TypeVar("T")


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run `work`; if the client disconnects first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_until_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            log.info("client disconnected; request cancelled")
    # A task cancelled just above is not `cancelled()` yet (that takes its next turn on the loop),
    # so "not done" means the client left too; asking it for a result would raise InvalidStateError.
    if not task.done() or task.cancelled():
        raise ClientGone("client disconnected before the response was ready")
    return task.result()
