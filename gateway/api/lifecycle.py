"""The server's lifecycle as probes and load balancers see it: ready once preloading is done,
and a graceful drain on shutdown.

On SIGTERM the server keeps listening while requests are in flight (up to --drain-timeout):
`/ready` answers 503, new work is refused with 503 and `Retry-After`, and everything already
running finishes. Only then does uvicorn close the listener and the workers stop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

import msgspec
from litestar.types import ASGIApp, HTTPResponseBodyEvent, HTTPResponseStartEvent, HTTPScope, Receive, Scope, Send

from gateway.api.request_id import current_request_id
from protocol.errors import ErrorResponse

# Probes and read-only views stay open while draining; anything that starts work is refused.
OPEN_PATHS = ("/health", "/ready", "/metrics")


class Lifecycle:
    def __init__(self) -> None:
        self.ready = False  # preloading done; /ready answers 200
        self._draining = False
        self.inflight = 0
        # Called once when the drain starts (from the signal handler: keep them quick, no awaits).
        self.on_drain: list[Callable[[], None]] = []

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        starts = value and not self._draining
        self._draining = value
        if starts:
            for callback in self.on_drain:
                callback()

    async def wait(self, timeout: float) -> None:
        """Until no request is in flight, or `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


class DrainMiddleware:
    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self.drain = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.drain.draining and cast("HTTPScope", scope)["method"] != "GET":
            await _refuse(send)
            return
        self.drain.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.inflight -= 1


async def _refuse(send: Send) -> None:
    body = msgspec.json.encode(ErrorResponse(error="the server is shutting down; retry on another instance "
                                                   "or in a moment", request_id=current_request_id()))  # fmt: skip
    start: HTTPResponseStartEvent = {
        "type": "http.response.start",
        "status": 503,
        "headers": [(b"content-type", b"application/json"), (b"retry-after", b"5"), (b"connection", b"close")],
    }
    await send(start)
    end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body, "more_body": False}
    await send(end)
