"""Defences against the web pages a user visits while the server runs on their machine.

- A page may POST a `text/plain` body to any address without a CORS preflight: every request
  with a body must say `application/json`, else 415 (the OpenAI SDKs and curl with `-H` do).
- DNS rebinding lets a page on an attacker's domain reach 127.0.0.1 under its own host name, and
  then read the answers: the `Host` header must be one this server answers to (loopback names and
  the address it is bound to, plus `--allowed-host`), else 403.
"""

from __future__ import annotations

from typing import cast

from litestar.types import ASGIApp, HTTPScope, Receive, Scope, Send

from gateway.api.error_body import send_error

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
JSON_TYPES = (b"application/json",)


def host_name(header: str) -> str:
    """`example.com:8080` -> `example.com`; `[::1]:8080` -> `::1`."""
    if header.startswith("["):
        return header[1:].partition("]")[0].lower()
    return header.rpartition(":")[0].lower() if header.count(":") == 1 else header.lower()


class BrowserGuard:
    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str] | None) -> None:
        """`allowed_hosts` None: any Host header (the operator said `--allowed-host '*'`)."""
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if self.allowed_hosts is not None and host and host_name(host) not in self.allowed_hosts:
            await send_error(send, scope["path"], 403, f"this server does not answer to the host name {host[:100]!r} "
                             "(a defence against DNS rebinding); its operator can allow it with --allowed-host")  # fmt: skip
            return
        if cast("HTTPScope", scope)["method"] in WITH_BODY:
            ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if ctype not in JSON_TYPES:
                await send_error(send, scope["path"], 415, "`Content-Type` must be application/json")
                return
        await self.app(scope, receive, send)
