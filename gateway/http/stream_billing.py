"""The one billing rule of every streamed route (chat, text completions, the agent dialects, speech).

A streamed request is counted (metrics and usage ledger) before its final bytes go out: a client
that reads the end of the stream and at once asks /v1/usage or /metrics finds it there. A stream
that fails or is left by its client is counted too, once, with what it had produced.

A route writes its stream as a plain async generator of chunks and yields `FINAL` where its
ending starts (a last finish chunk, a usage chunk, `[DONE]`, a done event); `billed` settles there
and turns a GenieXError into the route's error chunks (the status has gone out by then).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from typing import Final, Literal, TypeVar

import structlog
from litestar.response import ServerSentEventMessage

from gateway.errors import GenieXError
from gateway.http.encoding import encode
from gateway.ops.accounting import outcome_of

log = structlog.get_logger("gateway.relay")

T = TypeVar("T")


class _Mark(enum.Enum):
    FINAL = "final"


FINAL: Final = _Mark.FINAL
"""Yielded by a route's stream where its ending starts: the request is settled before what follows."""

Stream = AsyncGenerator[T | Literal[_Mark.FINAL], None]


async def billed(source: Stream[T], settle: Callable[[str], None],
                 fail: Callable[[GenieXError], Iterable[T]]) -> AsyncIterator[T]:  # fmt: skip
    """`source`'s chunks, with `settle(outcome)` called exactly once: "ok" at its FINAL, or as the
    stream stopped ("error", or "cancelled" when the client left). A GenieXError from `source`
    sends `fail(exc)`'s chunks instead of the rest."""
    settled = False

    def once(outcome: str) -> None:
        nonlocal settled
        if not settled:
            settled = True
            settle(outcome)

    try:
        async for chunk in source:
            if chunk is FINAL:
                once("ok")
            else:
                yield chunk
    except GenieXError as exc:
        once(outcome_of(exc))  # "error", or "cancelled" for a request past its deadline
        log.warning("stream failed", error=exc.message, status=exc.status)
        for chunk in fail(exc):
            yield chunk
    except BaseException as exc:  # the client went away (GeneratorExit, CancelledError), or a bug
        once(outcome_of(exc))
        raise
    finally:
        once("ok")  # a source that ended without marking its ending still counts, once
        await source.aclose()  # left early: the route's generator ends now, not when collected


def error_event(exc: GenieXError) -> list[ServerSentEventMessage]:
    """The `fail` of the routes whose stream ends in a plain error: `event: error`, `{"error": ...}`."""
    return [ServerSentEventMessage(data=encode({"error": exc.message}), event="error")]
