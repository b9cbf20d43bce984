"""Error bodies in the dialect of the route that failed.

Every route answers `{"error": "..."}` with the status telling the class, except the Anthropic
Messages routes (`/v1/messages...`), whose clients parse Anthropic's shape:
`{"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}`. The choice is
made here by path, once, for the exception handlers and for the middlewares that answer before
any handler runs (API keys and their limits, the browser guard, the drain).

Overload on Anthropic routes is 529 `overloaded_error`, not 503: Anthropic's API and its clients
use 529 for "busy, back off and retry" (the SDKs raise `OverloadedError` for it, agent CLIs retry
it), both statuses are retried by the SDKs, and `Retry-After` is kept either way. The other routes
keep the standard 503 that load balancers and OpenAI clients expect.
"""

from __future__ import annotations

import msgspec
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Send

from gateway.http.request_id import current_request_id
from protocol import anthropic
from protocol.errors import ErrorResponse

ANTHROPIC_ROUTES = "/v1/messages"
OVERLOADED = 529  # Anthropic's status for overloaded_error

_ANTHROPIC_TYPES: dict[int, anthropic.ErrorType] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def speaks_anthropic(path: str) -> bool:
    return path == ANTHROPIC_ROUTES or path.startswith(ANTHROPIC_ROUTES + "/")


def anthropic_error(status: int, message: str) -> tuple[int, anthropic.ErrorResponse]:
    """The status and body Anthropic's clients expect for an error of `status`."""
    kind = _ANTHROPIC_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    if kind == "overloaded_error":
        status = OVERLOADED
    return status, anthropic.ErrorResponse(anthropic.ErrorDetail(kind, message), request_id=current_request_id())


def error_body(path: str, status: int, message: str, code: str | None = None) -> tuple[int, bytes]:
    """(status, JSON body) of an error on `path`."""
    if speaks_anthropic(path):
        status, body = anthropic_error(status, message)
        return status, msgspec.json.encode(body)
    return status, msgspec.json.encode(ErrorResponse(error=message, code=code, request_id=current_request_id()))


async def send_error(send: Send, path: str, status: int, message: str,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:  # fmt: skip
    """Answer from a middleware, before any handler runs."""
    status, body = error_body(path, status, message)
    start: HTTPResponseStartEvent = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), *(headers or [])],
    }
    await send(start)
    end: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body, "more_body": False}
    await send(end)
