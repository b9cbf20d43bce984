"""API keys at the door: with keys configured, every route but the health probes needs one.

`Authorization: Bearer KEY` or `x-api-key: KEY`; missing or wrong is 401 with `WWW-Authenticate`.
The caller's label (never the key) goes to the request's log lines, its usage-ledger rows and its
prompt-cache tenant. A key with limits is counted in here too: over one, 429 with `Retry-After`.
Whether the key may manage models (pull, delete, copy: gateway/ops/keys.py) goes to the request's
state as well, for `require_manage`; without keys every caller may.
"""

from __future__ import annotations

from typing import cast

import structlog
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.types import ASGIApp, HTTPScope, Receive, Scope, Send

from gateway.errors import Forbidden
from gateway.http.deadline import KEY_TIMEOUT
from gateway.http.error_body import send_error
from gateway.ops.keys import KeyRing
from gateway.ops.ledger import key_label
from gateway.ops.limits import KeyLimiter, Refusal

log = structlog.get_logger("gateway.auth")

OPEN_PATHS = frozenset({"/health", "/ready"})
# The web UI's pages, assets and the API schema hold no data (the pages ask the API, with the key
# the person enters), so a browser can load them before it has a key.
WEB_PATHS = frozenset({"/", "/voice", "/ops", "/try", "/docs", "/openapi.json"})
WEB_PREFIX = "/static/"
CALLER = "caller"  # where the caller's label lives in the request's state
MANAGE = "manage"  # and whether its key may manage models (set only when the server has keys)
MCP_SERVERS = "mcp_servers"  # and the MCP servers its key may use (None: all)
KEY_PRIORITY = "key_priority"  # and the highest priority its requests get (gateway/http/priority.py)


# A browser cannot set headers on a WebSocket: OpenAI's Realtime clients there offer the key as a subprotocol.
KEY_SUBPROTOCOL = "openai-insecure-api-key."


def presented_key(headers: dict[bytes, bytes]) -> str:
    auth = headers.get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
    if key:
        return key
    for offered in headers.get(b"sec-websocket-protocol", b"").decode("latin-1").split(","):
        if offered.strip().startswith(KEY_SUBPROTOCOL):
            return offered.strip()[len(KEY_SUBPROTOCOL) :]
    return ""


def caller_of(request: ASGIConnection) -> str:
    """The label the ledger and the prompt cache know this caller by."""
    label = request.scope.get("state", {}).get(CALLER)
    if label:
        return str(label)
    # Without server keys, whatever key the client sent names it, in either header (the Anthropic
    # SDKs send `x-api-key`, the OpenAI SDKs `Authorization: Bearer`).
    key = presented_key(dict(request.scope["headers"]))
    return key_label(f"Bearer {key}" if key else None)


def require_manage(request: Request, what: str) -> None:
    """Refuse (403) a caller whose API key may not manage models; `what` names the act ("pull models").
    A server without keys lets everyone: it is reachable only from where its operator allowed."""
    state = request.scope.get("state", {})
    if CALLER in state and not state.get(MANAGE, False):
        raise Forbidden(
            f"this API key ({state[CALLER]}) may not {what}: only keys given with --api-key, or marked "
            "manage=yes in the key file, manage models"
        )


def mcp_servers_of(request: Request) -> frozenset[str] | None:
    """The MCP servers the caller's key may use; None (all) on a server without keys."""
    state = request.scope.get("state", {})
    if CALLER not in state:
        return None
    servers: frozenset[str] | None = state.get(MCP_SERVERS, frozenset())
    return servers


def tenant_of(request: ASGIConnection) -> str:
    """The prompt-cache tenant: the caller's key when the server has keys, else one tenant for all."""
    return str(request.scope.get("state", {}).get(CALLER) or "")


class ApiKeyAuth:
    def __init__(self, app: ASGIApp, keys: KeyRing, limiter: KeyLimiter, metrics_open: bool = True,
                 web_open: bool = False) -> None:  # fmt: skip
        self.app = app
        self.keys = keys
        self.limiter = limiter
        self.open_paths = OPEN_PATHS | ({"/metrics"} if metrics_open else set()) | (WEB_PATHS if web_open else set())
        self.open_prefix = WEB_PREFIX if web_open else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        http = cast("HTTPScope", scope)
        # A WebSocket (`/v1/realtime`) holds its key for its whole session: refused before it opens
        # (the client sees a 403 on its handshake), and counted as one request of its key's.
        socket = scope["type"] == "websocket"
        if not self.keys.enabled or not (socket or scope["type"] == "http") or (not socket and (
                scope["path"] in self.open_paths or http["method"] == "OPTIONS"
                or (self.open_prefix is not None and scope["path"].startswith(self.open_prefix)))):  # fmt: skip
            await self.app(scope, receive, send)
            return
        key = self.keys.check(presented_key(dict(http["headers"])))
        if key is None:
            await (_refuse_socket(send, "missing or wrong API key") if socket else _unauthorized(send, scope["path"]))
            return
        state = http.setdefault("state", {})
        state[CALLER] = key.label
        state[MANAGE] = key.manage
        state[MCP_SERVERS] = key.mcp
        state[KEY_PRIORITY] = key.priority
        if key.limits.timeout:
            state[KEY_TIMEOUT] = key.limits.timeout  # its own request deadline (gateway/http/deadline.py)
        structlog.contextvars.bind_contextvars(api_key=key.label)
        if not key.limits.any:
            await self.app(scope, receive, send)
            return
        refusal = await self.limiter.enter(key.label, key.limits)
        if refusal is not None:
            await (_refuse_socket(send, refusal.message()) if socket else _too_many(send, scope["path"], refusal))
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.limiter.release(key.label)


async def _refuse_socket(send: Send, why: str) -> None:
    log.info("websocket refused", why=why)
    await send({"type": "websocket.close", "code": 1008, "reason": why[:120]})


async def _unauthorized(send: Send, path: str) -> None:
    message = "missing or wrong API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`"
    await send_error(send, path, 401, message, [(b"www-authenticate", b'Bearer realm="geniex"')])


async def _too_many(send: Send, path: str, refusal: Refusal) -> None:
    log.info("request refused by a key limit", limit=refusal.limit, retry_after_s=refusal.retry_after_s)
    headers = [(b"retry-after", str(refusal.retry_after_s).encode())]
    await send_error(send, path, 429, f"{refusal.message()}; retry after {refusal.retry_after_s} s", headers)
