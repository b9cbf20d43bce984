"""`/mcp`: MCP's Streamable HTTP transport, through the official SDK's session manager, stateless.

Stateless, because each POST then runs in its own HTTP request: behind that request's API key,
limits, deadline and request id (the middlewares of every route run around it), and counted by
the drain like any route. A session would run every later call in the task its `initialize`
started, with that first request's key and deadline; it would also be state to bound and
expire, and lost by a restart, for nothing this server uses: it sends no requests of its own to
a client (sampling, elicitation) and no notifications outside a call. The 2026-07-28 revision of
the protocol is stateless by design, and the SDK serves it on the same endpoint.

A GET (a stream for server-initiated messages) and a DELETE (the end of a session) are answered
405, as the transport's spec allows a server without them: in stateless mode the SDK would hold
a GET's stream open, with nothing ever to send, for as long as the client stays, and a drain
would wait on it.

The route is a plain path, not a mount: Litestar hands a mounted app the rest of the path
(`/`), and the middlewares would then see `/` (the web UI's page, open without a key) and not
`/mcp`. The SDK's session manager is made on the first request (importing the SDK costs about
half a second of the server's start) and runs in a task of its own until the app stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, cast

import structlog
from litestar import Litestar, asgi
from litestar.handlers import ASGIRouteHandler
from litestar.types import HTTPScope, Receive, Scope, Send

from gateway.http.error_body import send_error
from gateway.http.services import Services

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

log = structlog.get_logger("gateway.mcp_server")

PATH = "/mcp"
BODY_SLACK = 64 << 10  # the JSON-RPC envelope and the other arguments around a base64 audio clip


def body_limit(max_body_mb: int) -> int:
    """A call's body may hold --max-body-mb of audio as base64 (4 characters for 3 bytes)."""
    return math.ceil((max_body_mb << 20) * 4 / 3) + BODY_SLACK


class McpEndpoint:
    """The SDK's session manager for `/mcp`, made on first use; its `run()` lives in a task of
    its own between the first request and the app's shutdown."""

    def __init__(self) -> None:
        self.services: Services | None = None
        self._manager: StreamableHTTPSessionManager | None = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Litestar) -> AsyncIterator[None]:
        self.services = app.state.services  # set by the app's resources, entered before this
        try:
            yield
        finally:
            await self.close()

    async def manager(self) -> StreamableHTTPSessionManager:
        async with self._lock:
            if self._manager is None:
                assert self.services is not None, "the app's lifespan has not started"
                from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

                from gateway.dialects.mcp.server import build

                services = self.services
                server = build(services, services.metrics.mcp_server_call)
                manager = StreamableHTTPSessionManager(server, stateless=True,
                                                       max_request_body_size=body_limit(services.settings.max_body_mb))  # fmt: skip
                running = asyncio.get_running_loop().create_future()
                # A context of its own: not the first request's (its request id, key, deadline).
                self._task = asyncio.create_task(self._run(manager, running), name="mcp-server",
                                                 context=contextvars.Context())  # fmt: skip
                await running
                self._manager = manager
                log.info("MCP server ready", path=PATH)
            return self._manager

    async def _run(self, manager: StreamableHTTPSessionManager, running: asyncio.Future[None]) -> None:
        try:
            async with manager.run():
                running.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not running.done():
                running.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            raise

    async def close(self) -> None:
        """At shutdown, after the drain: what still runs is cancelled (the SDK's task group)."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                async with asyncio.timeout(10):
                    await self._task

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if cast("HTTPScope", scope)["method"] != "POST":
            await send_error(send, PATH, 405, f"{PATH} takes POST: this server keeps no sessions and sends no "
                             "messages of its own (MCP's Streamable HTTP, stateless)", [(b"allow", b"POST")])  # fmt: skip
            return
        manager = await self.manager()
        await manager.handle_request(scope, receive, send)  # type: ignore[arg-type]  # Litestar's ASGI types are Starlette's


def route(endpoint: McpEndpoint) -> ASGIRouteHandler:
    @asgi(PATH, copy_scope=True)
    async def mcp_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await endpoint.handle(scope, receive, send)

    return mcp_endpoint
