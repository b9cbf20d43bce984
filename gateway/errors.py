"""One exception hierarchy for the gateway; one handler maps it to the spec's error body."""

from __future__ import annotations

from protocol.wire import ErrorKind


class GenieXError(Exception):
    """An error with an HTTP status, rendered as `{"error": message}`."""

    status: int = 500
    code: str | None = None

    def __init__(self, message: str, *, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.headers = headers or {}


class BadRequest(GenieXError):
    status = 400


class Unsupported(BadRequest):
    """The model does not do this kind of request (an embedding model asked to chat)."""

    code = "unsupported_task"


class ModelNotFound(GenieXError):
    status = 404


class NotFound(GenieXError):
    """Something the request names by id that the server does not hold (a stored response)."""

    status = 404


class FailedDependency(GenieXError):
    """A service the request depends on failed: an MCP server that cannot list its tools (424, as OpenAI answers it)."""

    status = 424


class Conflict(GenieXError):
    """The request contradicts what is running now (unloading a model that is serving)."""

    status = 409

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class Overloaded(GenieXError):
    """The bounded queue is full, or a crash-looping worker is backing off."""

    status = 503

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class WorkerUnavailable(GenieXError):
    status = 503


class WorkerDied(GenieXError):
    status = 500


class EngineFailure(GenieXError):
    status = 500


class BadGateway(GenieXError):
    """The remote server an upstream model lives on failed, refused us, or cannot be reached."""

    status = 502


class GatewayTimeout(GenieXError):
    """The remote server an upstream model lives on did not answer in time."""

    status = 504


class DeadlineExceeded(GatewayTimeout):
    """The request ran past its time limit (`--request-timeout-s`, a key's `timeout=`); it was cancelled,
    and is billed as a cancelled request is."""


class ClientGone(GenieXError):
    """The client disconnected before its answer was ready; nobody reads the status, the log does."""

    status = 499  # nginx's "client closed request"


_FOR_KIND: dict[ErrorKind, type[GenieXError]] = {
    ErrorKind.BAD_REQUEST: BadRequest,
    ErrorKind.UNSUPPORTED: Unsupported,
    ErrorKind.OVERLOADED: WorkerUnavailable,
    ErrorKind.ENGINE: EngineFailure,
    ErrorKind.UPSTREAM: BadGateway,
    ErrorKind.UPSTREAM_TIMEOUT: GatewayTimeout,
}


def error_for(kind: ErrorKind, message: str, code: str | None = None) -> GenieXError:
    """The gateway's error for a worker's refusal: the one place a kind becomes an HTTP status."""
    return _FOR_KIND[kind](message, code=code)


class Forbidden(GenieXError):
    """The caller's API key is valid but may not do this (pull, delete or copy models)."""

    status = 403
