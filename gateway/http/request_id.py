"""A request id on every log line, and one summary line per request."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable
from typing import cast

import structlog
from litestar.types import ASGIApp, HTTPScope, Message, Receive, Scope, Send

log = structlog.get_logger("gateway.http")

HEADER = b"x-request-id"
# A client's own id is kept when it is a plain token (a tracing id, a UUID); anything else (not
# ASCII, control characters, too long) is replaced, since it is echoed in a header and the logs.
_CLIENT_ID = re.compile(rb"^[A-Za-z0-9._:/+=-]{1,64}$")


def request_id_of(headers: Iterable[tuple[bytes, bytes]]) -> str:
    given = next((v for k, v in headers if k == HEADER), b"")
    return given.decode() if _CLIENT_ID.match(given) else f"req-{uuid.uuid4().hex[:12]}"


def current_request_id() -> str | None:
    return structlog.contextvars.get_contextvars().get("request_id")


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope["headers"])
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=rid)
        t0 = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (HEADER, rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = scope["path"]
            if path not in ("/health", "/ready", "/metrics"):
                bound = structlog.contextvars.get_contextvars()
                outcome = bound.get("outcome") or ("ok" if 0 < status < 400 else "error")
                log.info("request", method=cast("HTTPScope", scope)["method"], path=path, status=status, outcome=outcome,
                         ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
            structlog.contextvars.clear_contextvars()
