"""The gateway's connections to the configured MCP servers, through the official `mcp` SDK.

A stdio server is started on first use, as the service's own user, with a minimal environment
(the SDK's: PATH, HOME, USER, ...) and the config's `env`: nothing of the gateway's own (its API
keys, GENIEX_*) reaches it. It is kept while the server runs, shared by every request, and
stopped at shutdown. A server that fails (it exits, its pipe breaks, it cannot start) is started
again by the next call, the first time at once, then after a back-off that doubles up to
`MAX_BACKOFF_S`; meanwhile its calls fail fast, naming the wait. An HTTP server's session is kept
the same way; a request that sets headers (where `requestHeaders` allows) gets a session of its
own for each operation, so that its headers never reach another request's calls.

Every call is bounded: its time (`--mcp-call-timeout-s`, the wait for a slot included), its
result (`--mcp-max-result-kb`, gateway/mcp/results.py), and the calls a server runs at once
(`--mcp-concurrency`, across all requests; more wait their turn).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from gateway.mcp import results
from gateway.mcp.config import ServerConfig
from gateway.mcp.results import Outcome, failed
from gateway.mcp.stdio import bounded_stdio
from protocol.limits import MAX_TOOLS

if TYPE_CHECKING:
    from mcp import Client

log = structlog.get_logger("gateway.mcp")

MAX_BACKOFF_S = 30.0
START_TIMEOUT_S = 30.0  # a server's start (`npx -y` may fetch its package first); at least the call's bound
MAX_LIST_PAGES = 16
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
MAX_DESCRIPTION = 2048  # characters of a tool's description the model reads (a server's text, in every prompt)
CONNECTION_CLOSED = -32000  # the SDK's code for a session whose transport closed (mcp_types.jsonrpc)


class Unavailable(Exception):
    """The server cannot be reached now (it failed to start, or waits out its back-off)."""


class McpTool(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    annotations: dict[str, Any] | None = None
    read_only: bool = False


@contextlib.asynccontextmanager
async def _http(url: str, headers: dict[str, str], max_bytes: int) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with create_mcp_http_client(headers=headers or None) as http, \
            streamable_http_client(url, http_client=http, max_sse_event_size=max_bytes) as streams:  # fmt: skip
        yield streams


class _Server:
    def __init__(self, config: ServerConfig, concurrency: int, connect_timeout_s: float,
                 max_message_bytes: int) -> None:  # fmt: skip
        self.config = config
        self.max_message_bytes = max_message_bytes
        self.connect_timeout_s = connect_timeout_s
        self.gate = asyncio.Semaphore(concurrency)
        self.lock = asyncio.Lock()  # one start at a time
        self.client: Client | None = None
        self.task: asyncio.Task[None] | None = None
        self.stop = asyncio.Event()
        self.failures = 0
        self.retry_at = 0.0
        self.listing: list[McpTool] | None = None
        self.starts = 0
        self.too_large = False  # the session ended on a message over the bound

    def ended(self, stop: asyncio.Event, why: str) -> None:
        """A stdio session's server stopped sending: over the bound, or its process exited (idle,
        or mid-call). Its session ends (`stop`: that session's own), and the next call starts the
        server again, instead of failing on a dead pipe."""
        if why == "too_large":
            self.too_large = True
        stop.set()
        if stop is self.stop:
            self.client = None

    def new_client(self, headers: dict[str, str] | None = None, stop: asyncio.Event | None = None) -> Client:
        # The SDK is imported on first use: it costs about a second of the gateway's start.
        from mcp import Client
        from mcp.types import Implementation

        c = self.config
        server: Any
        if c.transport == "stdio":
            ended = stop or asyncio.Event()
            server = bounded_stdio(c.command, list(c.args), c.env, c.cwd, self.max_message_bytes, c.label,
                                   lambda why: self.ended(ended, why))  # fmt: skip
        else:
            server = _http(c.url, {**c.headers, **(headers or {})}, self.max_message_bytes)
        return Client(server, client_info=Implementation(name="geniex", version="1"), cache=None)

    async def connected(self) -> Client:
        async with self.lock:
            if self.client is not None and not self.stop.is_set() and self.task is not None and not self.task.done():
                return self.client
            wait = self.retry_at - time.monotonic()
            if wait > 0:
                raise Unavailable(f"MCP server {self.config.label} failed and is started again in {wait:.0f} s")
            self.stop = asyncio.Event()
            up: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
            self.task = asyncio.create_task(self._run(up), name=f"mcp-{self.config.label}")
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    client = await asyncio.shield(up)
            except TimeoutError:
                self.stop.set()
                self.task.cancel()
                self._failed()
                raise Unavailable(f"MCP server {self.config.label} did not start within "
                                  f"{self.connect_timeout_s:g} s") from None  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - whatever stopped it, the server is unavailable
                self._failed()
                raise Unavailable(f"MCP server {self.config.label} could not start: {_why(exc)}") from None
            self.starts += 1
            log.info("MCP server started", server=self.config.label, transport=self.config.transport,
                     start=self.starts)  # fmt: skip
            return client

    async def _run(self, up: asyncio.Future[Client]) -> None:
        """Holds the session open (its context lives in this one task) until told to stop."""
        stop = self.stop
        try:
            async with self.new_client(stop=stop) as client:
                self.client = client
                up.set_result(client)
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - a server's failure is the server's, never the gateway's
            if not up.done():
                up.set_exception(Exception(_why(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("MCP server session ended", server=self.config.label, error=_why(exc))
        finally:
            if stop is self.stop:  # not a later session's
                self.client = None
                self.listing = None

    def _failed(self) -> None:
        self.failures += 1
        backoff = 0.0 if self.failures == 1 else min(MAX_BACKOFF_S, 2.0 ** (self.failures - 2))
        self.retry_at = time.monotonic() + backoff

    def broken(self, why: str) -> None:
        """The session cannot be trusted any more (its process exited, its pipe broke): end it;
        the next call starts the server again."""
        log.warning("MCP server failed; it starts again on its next use", server=self.config.label, error=why)
        self.stop.set()
        self.client = None
        self.listing = None
        self._failed()

    def worked(self) -> None:
        self.failures = 0

    async def close(self) -> None:
        self.stop.set()
        if self.task is not None:
            with contextlib.suppress(BaseException):
                async with asyncio.timeout(10):
                    await self.task


def _mcp_error() -> type[Any]:
    """The SDK's error for a JSON-RPC error answer (imported once a call has been made)."""
    from mcp.shared.exceptions import MCPError

    return MCPError


def _why(exc: BaseException) -> str:
    """An exception's message, from inside the exception groups anyio raises."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return text[:500]


def _tool(t: Any) -> McpTool | None:
    if not TOOL_NAME.fullmatch(t.name or ""):
        return None
    annotations = t.annotations.model_dump(mode="json", exclude_none=True) if t.annotations is not None else None
    description = t.description if t.description is None or len(t.description) <= MAX_DESCRIPTION else \
        t.description[: MAX_DESCRIPTION - 3] + "..."  # fmt: skip
    return McpTool(name=t.name, input_schema=t.input_schema or {"type": "object"}, description=description,
                   annotations=annotations or None,
                   read_only=bool(t.annotations is not None and t.annotations.read_only_hint))  # fmt: skip


class Hub:
    """The configured servers; `on_call(label, outcome, seconds)` counts each call (metrics)."""

    def __init__(self, servers: dict[str, ServerConfig], *, call_timeout_s: float = 60.0,
                 max_result_bytes: int = 256 << 10, concurrency: int = 4,
                 on_call: Callable[[str, str, float], None] | None = None) -> None:  # fmt: skip
        self.configs = servers
        self.call_timeout_s = call_timeout_s
        self.max_result_bytes = max_result_bytes
        self.on_call = on_call
        # A message may carry a result up to the bound twice (as text and as structured content),
        # in JSON: beyond that the transport ends the session (gateway/mcp/stdio.py).
        message_bytes = 4 * max_result_bytes + (64 << 10)
        start_s = max(START_TIMEOUT_S, call_timeout_s)
        self._servers = {label: _Server(c, concurrency, start_s, message_bytes) for label, c in servers.items()}

    @property
    def labels(self) -> list[str]:
        return sorted(self.configs)

    @contextlib.asynccontextmanager
    async def _session(self, server: _Server, headers: dict[str, str] | None) -> AsyncIterator[Client]:
        """The shared session (started first, within its own bound), or one for these headers."""
        if headers:
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(server.connect_timeout_s):
                    client = await stack.enter_async_context(server.new_client(headers))
                yield client
        else:
            yield await server.connected()

    async def tools(self, label: str, headers: dict[str, str] | None = None) -> list[McpTool]:
        """The server's tools (kept from its first listing while its session lasts); Unavailable
        when it cannot be listed, with why."""
        server = self._servers[label]
        if server.listing is not None and not headers:
            return server.listing
        try:
            async with self._session(server, headers) as client, asyncio.timeout(self.call_timeout_s), server.gate:
                listed: list[McpTool] = []
                cursor: str | None = None
                for _ in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    listed += [t for t in map(_tool, page.tools) if t is not None]
                    cursor = page.next_cursor
                    if not cursor or len(listed) >= MAX_TOOLS:
                        break
        except Unavailable:
            raise
        except TimeoutError:
            raise Unavailable(f"MCP server {label} did not list its tools within {self.call_timeout_s:g} s") from None
        except _mcp_error() as exc:
            raise Unavailable(f"MCP server {label} refused to list its tools: {_why(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - whatever broke, it is that server's
            if not headers:
                server.broken(_why(exc))
            raise Unavailable(f"MCP server {label} failed listing its tools: {_why(exc)}") from None
        listed = listed[:MAX_TOOLS]
        if not headers:
            server.listing = listed
        return listed

    async def call(self, label: str, name: str, arguments: dict[str, Any],
                   headers: dict[str, str] | None = None) -> Outcome:  # fmt: skip
        """Run one call, bounded; every way it can end is an Outcome, never an exception."""
        server = self._servers[label]
        started = time.perf_counter()
        outcome = await self._call(server, name, arguments, headers)
        seconds = time.perf_counter() - started
        log.info("MCP call", server=label, tool=name, outcome=outcome.outcome, seconds=round(seconds, 3))
        if self.on_call is not None:
            self.on_call(label, outcome.outcome, seconds)
        return outcome

    async def _call(self, server: _Server, name: str, arguments: dict[str, Any],
                    headers: dict[str, str] | None) -> Outcome:  # fmt: skip
        label = server.config.label
        try:
            async with self._session(server, headers) as client, asyncio.timeout(self.call_timeout_s), server.gate:
                result = await client.call_tool(name, arguments)
        except Unavailable as exc:
            return failed("unavailable", results.UNAVAILABLE, str(exc))
        except TimeoutError:
            return failed("timeout", results.TIMED_OUT, f"MCP server {label} did not answer within "
                                                        f"{self.call_timeout_s:g} s (--mcp-call-timeout-s)")  # fmt: skip
        except _mcp_error() as exc:
            if exc.code != CONNECTION_CLOSED:  # the server answered with an error: it is still up
                return failed("protocol_error", exc.code, f"MCP server {label}: {_why(exc)}")
            return self._crashed(server, headers, _why(exc))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this request was cancelled (its client left, its deadline passed)
            # The SDK cancels a call whose HTTP connection died under it.
            return self._crashed(server, headers, "the connection to the server was lost")
        except Exception as exc:  # noqa: BLE001 - a broken pipe, an exited process, a malformed message
            return self._crashed(server, headers, _why(exc))
        server.worked()
        return results.outcome_of(result, self.max_result_bytes)

    @staticmethod
    def _crashed(server: _Server, headers: dict[str, str] | None, why: str) -> Outcome:
        label = server.config.label
        if server.too_large:
            why = f"it sent a message of more than {server.max_message_bytes:,} bytes"
        if not headers:
            server.broken(why)
        if server.too_large:
            server.too_large = False
            return failed("too_large", results.TOO_LARGE, f"MCP server {label} was stopped: {why}, over this server's "
                                                          "bound (--mcp-max-result-kb); it starts again on its next use")  # fmt: skip
        return failed("crashed", results.CONNECTION, f"MCP server {label} failed during the call: {why}")

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._servers.values()))
