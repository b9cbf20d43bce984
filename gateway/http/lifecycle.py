"""The server's lifecycle as probes and load balancers see it: ready once preloading is done,
and a graceful drain on shutdown.

On SIGTERM the server keeps listening while requests are in flight (up to --drain-timeout-s):
`/ready` answers 503, new work is refused with 503 and `Retry-After`, and everything already
running finishes. Only then does uvicorn close the listener and the workers stop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

from litestar.types import ASGIApp, HTTPScope, Receive, Scope, Send

from gateway.http.error_body import send_error

# Probes and read-only views stay open while draining; anything that starts work is refused.
OPEN_PATHS = ("/health", "/ready", "/metrics")


class Lifecycle:
    def __init__(self) -> None:
        self.ready = False  # preloading done; /ready answers 200
        self._draining = False
        self.inflight = 0
        # Called once when the drain starts (from the signal handler: keep them quick, no awaits).
        self.on_drain: list[Callable[[], None]] = []
        # Called when the drain runs out of time with requests still in flight: they must end them
        # with an answer (a 503, an error event), quickly and without awaiting.
        self.on_drain_timeout: list[Callable[[], None]] = []

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

    async def finish(self, timeout: float, grace: float = 5.0) -> None:
        """The drain: in-flight requests get `timeout` seconds to finish. Those still running then
        are ended by `on_drain_timeout` (a 503, or an error event and [DONE] in a stream) and get
        `grace` seconds for those last bytes; without that, the server would cut their connections
        (a bare 500, a stream without its end)."""
        await self.wait(timeout)
        if not self.inflight:
            return
        for callback in self.on_drain_timeout:
            callback()
        await self.wait(grace)


class DrainMiddleware:
    """Admission: refuses new work while draining, and beyond `max_requests` at once (the
    operator's --max-connections), in the route's error shape with `Retry-After`; probes pass."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle, max_requests: int) -> None:
        self.app = app
        self.drain = lifecycle
        self.max_requests = max_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.drain.draining and cast("HTTPScope", scope)["method"] != "GET":
            await send_error(send, scope["path"], 503, "the server is shutting down; retry on another instance or in "
                             "a moment", [(b"retry-after", b"5"), (b"connection", b"close")])  # fmt: skip
            return
        if self.drain.inflight >= self.max_requests:
            await send_error(send, scope["path"], 503, f"the server is answering {self.drain.inflight} requests, "
                             "its limit (--max-connections); retry shortly", [(b"retry-after", b"1")])  # fmt: skip
            return
        self.drain.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.inflight -= 1
