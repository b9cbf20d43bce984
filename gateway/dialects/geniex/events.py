"""GET /v1/events: model and worker state changes as Server-Sent Events.

On connect, one `worker` event per current worker (`snapshot: true`), then every change the
supervisor publishes (gateway/supervisor/events.py), as it happens; a comment line every
KEEPALIVE_S seconds while nothing happens, so proxies and clients keep the connection open.
A client that reads too slowly loses its oldest events and is sent `{"type": "dropped", "count": n}`.
The stream ends when the server drains. Behind the API keys like every /v1 route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from litestar import get
from litestar.di import NamedDependency
from litestar.response import ServerSentEvent, ServerSentEventMessage

from gateway.errors import Overloaded
from gateway.http.services import Services
from gateway.supervisor.events import EventHub, Subscription
from protocol.events import WorkerChange

KEEPALIVE_S = 15.0


@get("/v1/events")
async def events(services: NamedDependency[Services]) -> ServerSentEvent:
    if services.lifecycle.draining:
        raise Overloaded("the server is shutting down; retry on another instance or in a moment", retry_after=5)
    pool = services.pool
    # Subscribed and photographed in one step of the event loop: no change falls between the two.
    sub = pool.hub.subscribe()
    snapshot = [h.change(snapshot=True) for h in pool.workers.values()]
    return ServerSentEvent(_stream(pool.hub, sub, snapshot))


async def _stream(hub: EventHub, sub: Subscription, snapshot: list[WorkerChange]) -> AsyncIterator[bytes | ServerSentEventMessage]:  # fmt: skip
    encode = msgspec.json.encode
    try:
        for ev in snapshot:
            yield encode(ev)
        while not sub.closed:
            batch = await sub.next(KEEPALIVE_S)
            if not batch and not sub.closed:
                yield ServerSentEventMessage(comment="keep-alive", data=None)  # a comment line alone: no event
            for event in batch:
                yield encode(event)
    finally:
        hub.unsubscribe(sub)


handlers = [events]
