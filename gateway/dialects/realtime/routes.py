"""`/v1/realtime`: OpenAI's Realtime API over a WebSocket (gateway/dialects/realtime/session.py runs it).

`?model=` names the chat model (default: the server's), `?intent=transcription` opens a
transcription session. The key comes as for every route (`Authorization`, `x-api-key`), or as a
browser offers it, the subprotocol `openai-insecure-api-key.KEY` (gateway/http/auth.py). A key holds
at most `--realtime-sessions-per-key` sessions; a session lasts at most `--realtime-max-session-s`
and ends after `--realtime-idle-s` without a client event while no response runs.
"""

from __future__ import annotations

import asyncio
import collections
import time

import msgspec
import structlog
from litestar import WebSocket, websocket
from litestar.di import NamedDependency
from litestar.exceptions import WebSocketDisconnect

from gateway.dialects.realtime.config import RealtimeProblem, opened
from gateway.dialects.realtime.session import RealtimeSession
from gateway.http.auth import caller_of, tenant_of
from gateway.http.services import Services
from protocol import realtime as rt

log = structlog.get_logger("gateway.realtime")

SUBPROTOCOL = "realtime"  # what OpenAI's browser clients offer beside their key
_open: collections.Counter[str] = collections.Counter()  # sessions per caller, in this process


def _subprotocol(socket: WebSocket) -> str | None:
    offered = [p.strip() for p in socket.headers.get("sec-websocket-protocol", "").split(",")]
    return SUBPROTOCOL if SUBPROTOCOL in offered else None


@websocket("/v1/realtime")
async def realtime(socket: WebSocket, services: NamedDependency[Services]) -> None:
    caller, settings = caller_of(socket), services.settings
    session_id = rt.new_id("sess")
    structlog.contextvars.bind_contextvars(request_id=session_id, path="/v1/realtime")
    await socket.accept(subprotocols=_subprotocol(socket))
    closed = False

    async def send_text(data: str) -> None:
        nonlocal closed
        if closed:
            return
        try:
            await socket.send_text(data)
        except Exception:  # noqa: BLE001 - the client is gone: what is left to say is dropped
            closed = True

    async def end(code: str, message: str) -> None:
        await send_text(_encode(code, message))
        if not closed:
            await socket.close(code=1000 if code != "session_limit" else 1008, reason=code)

    if _open[caller] >= settings.realtime_sessions_per_key:
        log.info("realtime session refused", open=_open[caller])
        services.metrics.realtime_ended.labels("refused").inc()
        await end("session_limit", f"this key holds {_open[caller]} realtime sessions, the most it may "
                  f"(--realtime-sessions-per-key {settings.realtime_sessions_per_key}); close one first")  # fmt: skip
        return
    query = socket.query_params
    try:
        config = opened(services, session_id, query.get("model"), query.get("intent"))
    except RealtimeProblem as p:
        await end(p.detail.code or "invalid_value", p.detail.message)
        return
    _open[caller] += 1
    services.metrics.realtime_session(True)
    ended = "client"
    session = RealtimeSession(services, config, send_text, caller, tenant_of(socket), session_id)
    started = time.monotonic()
    log.info("realtime session opened", kind=config.kind, model=config.chat_model, open=_open[caller])
    try:
        await session.send(rt.SessionCreated(session=config.session()))
        while not closed:
            now = time.monotonic()
            busy = (
                session.response is not None and session.response.task is not None and not session.response.task.done()
            )
            idle_left = settings.realtime_idle_s - (now - session.last_active)
            left = settings.realtime_max_session_s - (now - started)
            if left <= 0:
                ended = "expired"
                await end("session_expired", f"the session reached its bound of {settings.realtime_max_session_s:g} s "
                          "(--realtime-max-session-s)")  # fmt: skip
                break
            if idle_left <= 0 and not busy:
                ended = "idle"
                await end("session_idle", f"no client event for {settings.realtime_idle_s:g} s (--realtime-idle-s)")
                break
            try:
                async with asyncio.timeout(max(0.5, min(left, idle_left if not busy else 5.0))):
                    message = await socket.receive()
            except TimeoutError:
                if busy:
                    session.last_active = time.monotonic()
                continue
            if message["type"] == "websocket.disconnect":
                break
            text, data = message.get("text"), message.get("bytes")
            await session.handle(text if isinstance(text, str) else data if isinstance(data, bytes) else b"")
    except WebSocketDisconnect:
        pass
    finally:
        await session.close()
        services.metrics.realtime_session(False, ended)
        _open[caller] -= 1
        if not _open[caller]:
            del _open[caller]
        log.info("realtime session closed", seconds=round(time.monotonic() - started, 1), items=len(session.items),
                 audio_in_s=round(session.stream_ms / 1000, 1))  # fmt: skip


def _encode(code: str, message: str) -> str:
    return msgspec.json.encode(rt.Error(error=rt.ErrorDetail(type="invalid_request_error", code=code,
                                                             message=message))).decode()  # fmt: skip


handlers = [realtime]
