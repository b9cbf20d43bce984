"""One exception hierarchy for the gateway; one handler maps it to the spec's error body."""

from __future__ import annotations


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


class ModelNotFound(GenieXError):
    status = 404


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
