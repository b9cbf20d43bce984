"""The Litestar app factory: routes, error mapping, and the long-lived resources."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
import zmq.asyncio
from litestar import Litestar, MediaType, Request, Response
from litestar.config.cors import CORSConfig
from litestar.di import Provide
from litestar.exceptions import HTTPException, ValidationException
from litestar.middleware import DefineMiddleware
from litestar.plugins import PluginProtocol
from litestar.plugins.core import MsgspecDIPlugin
from litestar.types import ControllerRouterHandler

from gateway.dialects.anthropic import routes as messages
from gateway.dialects.geniex import events, health, mcp, openapi, ops, pull, tokens
from gateway.dialects.mcp.routes import McpEndpoint
from gateway.dialects.mcp.routes import route as mcp_server_route
from gateway.dialects.ollama import routes as ollama
from gateway.dialects.openai import (
    chat,
    completions,
    cv,
    diarize,
    embeddings,
    images,
    logits,
    models,
    speech,
    transcriptions,
)
from gateway.dialects.realtime import routes as realtime
from gateway.dialects.responses import routes as responses
from gateway.dialects.responses.state import ResponsesState
from gateway.errors import GenieXError
from gateway.http.auth import ApiKeyAuth
from gateway.http.deadline import DeadlineMiddleware
from gateway.http.error_body import error_body
from gateway.http.guards import LOOPBACK_NAMES, BrowserGuard
from gateway.http.headers import NOT_OFFERED_HEADER
from gateway.http.lifecycle import DrainMiddleware, Lifecycle
from gateway.http.request_id import RequestIdMiddleware
from gateway.http.services import Services, provide_services
from gateway.mcp import config as mcp_config
from gateway.mcp.hub import Hub
from gateway.models.models_file import ModelsFile
from gateway.models.store import ModelStore
from gateway.ops.energy import EnergyMeter
from gateway.ops.keys import KeyFileError, KeyRing
from gateway.ops.ledger import Ledger
from gateway.ops.limits import KeyLimiter
from gateway.ops.metrics import Metrics
from gateway.ops.settings import Settings
from gateway.ops.systemd import Systemd
from gateway.supervisor.pool import WorkerPool
from gateway.web import routes as web

log = structlog.get_logger("gateway")


def _error(req: Request, status: int, message: str, code: str | None = None,
           headers: dict[str, str] | None = None) -> Response[bytes]:  # fmt: skip
    """The error body in the dialect of the route (Anthropic's on /v1/messages, else ours)."""
    status, body = error_body(req.scope["path"], status, message, code)
    return Response(body, status_code=status, headers=headers, media_type=MediaType.JSON)


def _on_genie_error(req: Request, exc: GenieXError) -> Response[bytes]:
    log.warning("request failed", status=exc.status, error=exc.message, code=exc.code)
    return _error(req, exc.status, exc.message, exc.code, exc.headers)


_MISSING = re.compile(r"^Object missing required field `([^`]+)`")
_BODY = "data"  # the handlers' body parameter: Litestar names it where the request's own field is meant


def validation_detail(key: str | None, message: str) -> str:
    """One problem in the request's own terms: `messages[0].role`: a required field is missing."""
    key = "" if key in (None, _BODY) else key
    if m := _MISSING.match(message):
        return f"`{key + '.' if key else ''}{m.group(1)}`: a required field is missing"
    return f"`{key}`: {message}" if key else message


def _on_validation(req: Request, exc: ValidationException) -> Response[bytes]:
    details = [
        validation_detail(e.get("key"), str(e.get("message", ""))) if isinstance(e, dict) else str(e)
        for e in (exc.extra or [])
    ]
    message = "; ".join(details) or exc.detail
    log.info("invalid request", error=message)
    return _error(req, 400, f"invalid request: {message}")


def _on_http(req: Request, exc: HTTPException) -> Response[bytes]:
    return _error(req, exc.status_code, exc.detail, headers=exc.headers)


def _on_too_deep(req: Request, exc: RecursionError) -> Response[bytes]:
    # msgspec refuses a body nested deeper than Python's recursion limit with RecursionError.
    log.info("invalid request", error=str(exc))
    return _error(req, 400, "invalid request: the JSON nests too deeply")


def _on_unexpected(req: Request, exc: Exception) -> Response[bytes]:
    # The body never carries the exception: it may quote the request or the server's internals.
    log.exception("unexpected error", error=repr(exc))
    return _error(req, 500, "internal error; the server log has the details under this request id")


class _Gateway(Litestar):
    """Litestar without the plugins it adds when pydantic or attrs happen to be installed.

    Every contract here is a msgspec struct; importing those plugins cost about 130 ms of a
    0.6 s start (`python -X importtime`), whenever the OpenAI SDK (which needs pydantic) shares
    the environment. If Litestar renames this hook, the override is simply unused."""

    @staticmethod
    def _get_default_plugins(plugins: list[PluginProtocol]) -> list[PluginProtocol]:
        plugins.append(MsgspecDIPlugin())
        return plugins


def _reload_on_sighup(keys: KeyRing, models_file: ModelsFile) -> None:
    """SIGHUP reads the API key file and the models file again (one handler: a second would replace the first)."""

    def reload() -> None:
        if keys.key_file is not None:
            try:
                keys.reload()
                log.info("API keys read again", keys=len(keys.keys))
            except (OSError, KeyFileError) as exc:
                log.error("API key file not read again; the keys stay as they were", error=str(exc))
        models_file.reload("SIGHUP")

    if keys.key_file is not None or models_file.path is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread or on Windows
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)


CORS_EXPOSED = ["Retry-After", "X-Request-Id", NOT_OFFERED_HEADER]


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """The Host names this server answers to: loopback, the address it is bound to, its own host name
    when bound to every address, and `--allowed-host` (`*`: any)."""
    if "*" in settings.allowed_hosts:
        return None
    names = set(LOOPBACK_NAMES) | {h.lower() for h in settings.allowed_hosts} | {settings.host.lower()}
    if settings.host in ("0.0.0.0", "::", ""):
        names.add(socket.gethostname().lower())
    return frozenset(names)


def _abort_inflight(pool: WorkerPool) -> None:
    n = pool.abort("the server is shutting down and its drain timed out; retry on another instance or in a moment")
    log.warning("drain timed out; requests still running were ended with 503", requests=n)


def create_app(settings: Settings, lifecycle: Lifecycle | None = None, keys: KeyRing | None = None,
               models_file: ModelsFile | None = None) -> Litestar:  # fmt: skip
    """The app. `lifecycle` is the server's view of readiness and draining (its signal handler
    starts the drain); `keys` the API keys (read from the settings when not given); `models_file`
    the `--models-file`, already read (read as the app starts when not given)."""
    lifecycle = lifecycle or Lifecycle()
    keys = keys or KeyRing(settings.api_keys, settings.api_key_file)
    mcp_servers = mcp_config.load(settings.mcp_config)  # McpConfigError: the CLI names the file and stops
    limiter = KeyLimiter()
    responses_state = ResponsesState(settings, lifecycle)  # stored responses, background ones
    mcp_server = McpEndpoint()  # /mcp: this server's models as MCP tools

    @asynccontextmanager
    async def resources(app: Litestar) -> AsyncIterator[None]:
        zctx = zmq.asyncio.Context()
        metrics = Metrics()
        pool = WorkerPool(settings, zctx, metrics)
        store = ModelStore(settings.data_dir)
        if swept := store.sweep_partial():
            log.info("removed downloads that a stopped pull left behind", paths=[str(p) for p in swept])
        models = models_file or ModelsFile(settings.models_file, store)
        models.store = store  # reloads check table names against the store the server reads
        store.models_file = pool.models_file = models
        models.loaded = lambda model: bool(pool.residents_of(model))
        ledger = Ledger(settings.data_dir)
        hub = Hub(mcp_servers, call_timeout_s=settings.mcp_call_timeout_s, max_result_bytes=settings.mcp_max_result_kb << 10,
                  concurrency=settings.mcp_concurrency, on_call=metrics.mcp_call)  # fmt: skip
        energy = EnergyMeter.for_this_machine()  # each answer's share of what the machine draws, where told
        services = Services(settings, store, pool, ledger, metrics, lifecycle, limiter, models, mcp=hub, energy=energy)
        app.state.services = services
        metrics.watch(pool, limiter, ledger)
        pool.start()
        watching = asyncio.create_task(models.watch(), name="models-file")
        metering = asyncio.create_task(energy.run(), name="energy") if energy.enabled else None
        _reload_on_sighup(keys, models)
        systemd = Systemd()  # a no-op outside systemd
        systemd.start_watchdog()
        lifecycle.on_drain.append(systemd.stopping)
        lifecycle.on_drain.append(pool.hub.close)  # /v1/events streams end, so that the drain can finish
        # Running pulls end at once: they would hold the drain for as long as a download takes.
        lifecycle.on_drain.append(services.pulls.cancel_all)
        lifecycle.on_drain_timeout.append(lambda: _abort_inflight(pool))

        async def preload() -> None:
            # --preload's models, then the models file's `preload = true` ones; each with the file's defaults
            loaded: set[str] = set()
            for name in [*settings.preload, *models.preloads()]:
                try:
                    entry = store.resolve(name)
                    if entry.id not in loaded:
                        loaded.add(entry.id)
                        await services.worker(entry, claim=False)
                except Exception as exc:  # noqa: BLE001 - a bad preload must not stop the server
                    log.error("preload failed", model=name, error=str(exc))
            lifecycle.ready = True
            systemd.ready()

        preloading = asyncio.create_task(preload(), name="preload")
        log.info("geniex serving", url=f"{'https' if settings.certfile else 'http'}://{settings.host}:{settings.port}/v1", data_dir=str(settings.data_dir),
                 models=[e.id for e in store.entries()])  # fmt: skip
        try:
            yield
        finally:
            preloading.cancel()
            services.pulls.cancel_all()
            await hub.close()  # stdio servers stop with the gateway
            watching.cancel()
            if metering is not None:
                metering.cancel()
            lifecycle.ready = False
            systemd.stopping()
            try:
                await pool.close(settings.drain_timeout_s)
            finally:
                metrics.watch(None)
                ledger.close()  # after the pool, so requests it cut short are counted too
            zctx.term()
            await systemd.close()

    # Only the operator's origins; their preflights get the headers they ask for named back (Litestar
    # reflects them under "*"), as a literal "*" never covers Authorization in a browser.
    cors = CORSConfig(allow_origins=settings.origins, expose_headers=CORS_EXPOSED, max_age=600) if settings.origins \
        else None  # fmt: skip
    # The web UI and the API's schema (`--no-webui`: neither).
    webui: list[ControllerRouterHandler] = [*openapi.handlers, web.router()] if settings.webui else []
    return _Gateway(
        route_handlers=[
            *chat.handlers,
            *messages.handlers,
            responses.router(responses_state),
            *mcp.handlers,
            mcp_server_route(mcp_server),
            *completions.handlers,
            *logits.handlers,
            *embeddings.handlers,
            *images.handlers,
            *cv.handlers,
            *transcriptions.handlers,
            *diarize.handlers,
            *speech.handlers,
            *realtime.handlers,
            *models.handlers,
            *pull.handlers,
            *ollama.handlers,
            *events.handlers,
            *tokens.handlers,
            *health.handlers,
            *ops.handlers,
            *webui,
        ],
        dependencies={
            "services": Provide(provide_services, sync_to_thread=False),
            "lifecycle": Provide(lambda: lifecycle, sync_to_thread=False),
        },
        # /mcp's and the stored responses' stop first: they use the resources (the pool)
        lifespan=[resources, mcp_server.lifespan, responses_state.lifespan],
        middleware=[
            RequestIdMiddleware,
            DefineMiddleware(BrowserGuard, allowed_hosts=allowed_hosts(settings), origins=tuple(settings.origins)),
            DefineMiddleware(
                ApiKeyAuth, keys=keys, limiter=limiter, metrics_open=not settings.metrics_key, web_open=settings.webui
            ),
            DefineMiddleware(DeadlineMiddleware, default_s=settings.request_timeout_s),  # after the key: its timeout=
            DefineMiddleware(DrainMiddleware, lifecycle=lifecycle, max_requests=settings.max_connections),
        ],
        cors_config=cors,
        exception_handlers={
            GenieXError: _on_genie_error,
            ValidationException: _on_validation,
            HTTPException: _on_http,
            RecursionError: _on_too_deep,
            Exception: _on_unexpected,
        },
        # Litestar reads a body up to this and answers 413 beyond it (without reading the rest).
        request_max_body_size=settings.max_body_mb * 1024 * 1024,
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
