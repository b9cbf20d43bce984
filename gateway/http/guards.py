"""Defences against the web pages a user visits while the server runs on their machine.

- A page may POST to any address without a CORS preflight (so with no say from `--origins`) only
  with a body of a type Fetch calls CORS-safelisted, `text/plain`,
  `application/x-www-form-urlencoded` or `multipart/form-data` (what a form sends), or with no
  type at all (`fetch()` of an ArrayBuffer or an untyped Blob). Every other type, JSON included,
  makes the browser ask first, and CORS answers it. So: a safelisted type is refused (415), but on
  the routes whose spec takes `multipart/form-data` (FORM_PATHS), which take it; a form there,
  and a body with no type anywhere, are refused (403) when a browser's page sent them: a browser
  names the page in `Origin` on every POST, and it must be one of `--origins` or this server
  itself (its web UI). The SDKs, curl and Ollama's clients send no Origin, and a body with no type
  is read as JSON (LiteLLM's Ollama provider sends none; Ollama takes it).
- DNS rebinding lets a page on an attacker's domain reach 127.0.0.1 under its own host name, and
  then read the answers: the `Host` header must be one this server answers to (loopback names and
  the address it is bound to, plus `--allowed-host`), else 403.
- `/mcp` (MCP's Streamable HTTP, whose spec requires it) refuses any request a foreign page sent,
  whatever its type: a browser's `Origin` must be one of `--origins` or this server's own, else 403.
"""

from __future__ import annotations

from typing import cast

import structlog
from litestar.types import ASGIApp, HTTPScope, Receive, Scope, Send

from gateway.http.error_body import send_error

log = structlog.get_logger("gateway.guards")

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
FORM_TYPE = b"multipart/form-data"
# What a page may send anywhere without a preflight (Fetch's CORS-safelisted `Content-Type`s).
SAFELISTED_TYPES = frozenset({b"text/plain", b"application/x-www-form-urlencoded", FORM_TYPE})
FORM_PATHS = frozenset({"/v1/audio/transcriptions"})
# MCP's Streamable HTTP transport: servers MUST check `Origin` on every request and refuse a foreign one with 403.
ORIGIN_CHECKED_PATHS = frozenset({"/mcp"})


def host_name(header: str) -> str:
    """`example.com:8080` -> `example.com`; `[::1]:8080` -> `::1`."""
    if header.startswith("["):
        return header[1:].partition("]")[0].lower()
    return header.rpartition(":")[0].lower() if header.count(":") == 1 else header.lower()


def same_origin(origin: str, host: str) -> bool:
    """The page that posts is this server's own (its web UI): the Host header was checked above,
    so a rebinding page (whose Host is its own name) never gets here."""
    return bool(host) and origin.lower() in (f"http://{host}".lower(), f"https://{host}".lower())


def _origin(headers: dict[bytes, bytes]) -> str | None:
    origin = headers.get(b"origin")
    return None if origin is None else origin.decode("latin-1")


class BrowserGuard:
    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str] | None, origins: tuple[str, ...] = ()) -> None:
        """`allowed_hosts` None: any Host header (the operator said `--allowed-host '*'`);
        `origins`: the operator's `--origins` (`*`: any), whose pages may post forms."""
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.origins = frozenset(origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if self._foreign_host(host):
            await send_error(send, scope["path"], 403, f"this server does not answer to the host name {host[:100]!r} "
                             "(a defence against DNS rebinding); its operator can allow it with --allowed-host")  # fmt: skip
            return
        if scope["path"] in ORIGIN_CHECKED_PATHS and self._foreign_origin(origin := _origin(headers), host):
            await send_error(send, scope["path"], 403, f"the web page {(origin or '')[:100]!r} may not call "
                             f"{scope['path']}; its operator can allow the origin with --origins")  # fmt: skip
            return
        if cast("HTTPScope", scope)["method"] in WITH_BODY:
            refusal = self._body_refusal(scope["path"], headers, host)
            if refusal is not None:
                await send_error(send, scope["path"], *refusal)
                return
        await self.app(scope, receive, send)

    def _body_refusal(self, path: str, headers: dict[bytes, bytes], host: str) -> tuple[int, str] | None:
        """(status, why) for a body a web page may have sent without a preflight; None: let it in."""
        # The MIME type's essence, as a browser reads it to decide whether to ask first.
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if ctype in SAFELISTED_TYPES and not (ctype == FORM_TYPE and path in FORM_PATHS):
            need = "multipart/form-data" if path in FORM_PATHS else "application/json"
            return 415, f"`Content-Type` must be {need}"
        if ctype not in (FORM_TYPE, b""):
            return None  # a type a page must ask about first: CORS answers for it
        origin = _origin(headers)
        if not self._foreign_origin(origin, host):
            return None
        what = "a form" if ctype else "a body without a `Content-Type`"
        return 403, (f"{what} posted from the web page {(origin or '')[:100]!r} is refused (a page may post one to any "
                     "address); its operator can allow the origin with --origins")  # fmt: skip

    def _foreign_host(self, host: str) -> bool:
        return self.allowed_hosts is not None and bool(host) and host_name(host) not in self.allowed_hosts

    def _foreign_origin(self, origin: str | None, host: str) -> bool:
        """A browser's page (None: the SDKs and curl) that is neither one of `--origins` nor this server's own."""
        return origin is not None and "*" not in self.origins and origin not in self.origins \
            and not (self.allowed_hosts is not None and same_origin(origin, host))  # fmt: skip

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A page may open a WebSocket to any address (no CORS applies to them): as for forms, a
        browser's `Origin` must be this server's own page or one of `--origins`; and the Host as above."""
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        origin = _origin(headers)
        if self._foreign_host(host):
            why = f"host name {host[:100]!r} not answered (a defence against DNS rebinding)"
        elif self._foreign_origin(origin, host):
            why = f"a WebSocket opened by the web page {(origin or '')[:100]!r} is refused; --origins allows an origin"
        else:
            await self.app(scope, receive, send)
            return
        log.info("websocket refused", path=scope["path"], why=why)
        await send({"type": "websocket.close", "code": 1008, "reason": why[:120]})
