"""The root as Ollama's clients probe it: `HEAD /` is 200, and `GET /` from a client that does not
ask for a web page (no `text/html` in Accept) is Ollama's `Ollama is running`; a browser still gets
the web UI there. Open without an API key, like /health: it tells nothing but that a server is up.
It wraps the whole app (gateway/cli.py), since Litestar answers a method no route has (405) before
its own middleware runs.
"""

from __future__ import annotations

from typing import cast

from litestar.types import ASGIApp, HTTPScope, Receive, Scope, Send

OLLAMA_RUNNING = b"Ollama is running"


class OllamaRoot:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/":
            await self.app(scope, receive, send)
            return
        http = cast("HTTPScope", scope)
        accept = dict(http["headers"]).get(b"accept", b"").lower()
        method = http["method"]
        if method == "HEAD" or (method == "GET" and b"text/html" not in accept):
            body = b"" if method == "HEAD" else OLLAMA_RUNNING
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"content-length", str(len(OLLAMA_RUNNING)).encode())]})  # fmt: skip
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await self.app(scope, receive, send)
