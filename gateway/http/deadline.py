"""Each request's deadline: `--request-timeout-s`, or the API key's own `timeout=N` (the key file),
set as the request comes in (gateway/supervisor/deadline.py says where it is kept and read).

Not limited: the probes and metrics, the web pages, `/v1/events` (a stream a client keeps open for
as long as it watches) and pulls (a download takes as long as the network makes it).
"""

from __future__ import annotations

from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.supervisor import deadline

UNLIMITED = frozenset({"/health", "/ready", "/metrics", "/v1/events", "/v1/models/pull", "/api/pull"})
LIMITED = frozenset({"/mcp"})  # outside /v1/ and /api/, but each call runs a model as a route does
KEY_TIMEOUT = "timeout_s"  # where gateway/http/auth.py leaves the key's own limit in the request's state


class DeadlineMiddleware:
    def __init__(self, app: ASGIApp, default_s: float = 0.0) -> None:
        self.app = app
        self.default_s = default_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = (scope.get("state", {}).get(KEY_TIMEOUT) or self.default_s) if scope["type"] == "http" else 0
        if not limit or scope["path"] in UNLIMITED or not (scope["path"].startswith(("/v1/", "/api/"))
                                                           or scope["path"] in LIMITED):  # fmt: skip
            await self.app(scope, receive, send)
            return
        token = deadline.start(float(limit))
        try:
            await self.app(scope, receive, send)
        finally:
            deadline.DEADLINE.reset(token)
