"""A stdio transport for the MCP SDK's `Client` that bounds each message a server sends.

The SDK's own (`mcp.client.stdio`) reads a line of any length, re-joining its chunks as it goes:
a tool that answers 50 MB keeps the session busy (and the gateway's CPU) for minutes, and every
call queued behind it times out. Here a message longer than `max_bytes` ends the transport at
once: the server is stopped, its calls in flight fail ("Connection closed"), and the hub starts it
again on its next use (gateway/mcp/hub.py), naming why. The process runs the configured command
with the SDK's minimal environment and the config's `env`, as the SDK's transport does.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import structlog

log = structlog.get_logger("gateway.mcp")

STOP_GRACE_S = 2.0  # after stdin closes, before SIGTERM; as long again before SIGKILL


@contextlib.asynccontextmanager
async def bounded_stdio(command: str, args: list[str], env: dict[str, str], cwd: str | None, max_bytes: int,
                        label: str, on_end: Callable[[str], None]) -> AsyncIterator[tuple[Any, Any]]:  # fmt: skip
    """`on_end` is told why the server's output ended: "too_large" (a message over `max_bytes`:
    the transport stops the server) or "exited" (its stdout closed, as when the process exits)."""
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage
    from mcp_types.jsonrpc import jsonrpc_message_adapter

    process = await anyio.open_process([command, *args], env={**get_default_environment(), **env}, cwd=cwd,
                                       stderr=sys.stderr, start_new_session=True)  # fmt: skip
    read_in, read_out = anyio.create_memory_object_stream[Any](0)
    write_in, write_out = anyio.create_memory_object_stream[Any](0)

    def parsed(line: bytes) -> Any:
        try:
            return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:  # a malformed message fails the session's pending request, not the session
            return exc

    async def reader() -> None:
        assert process.stdout is not None
        pending = bytearray()
        async with read_in:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                async for chunk in process.stdout:
                    start = 0
                    while (end := chunk.find(b"\n", start)) >= 0:
                        pending += chunk[start:end]
                        start = end + 1
                        if len(pending) > max_bytes:
                            break
                        if pending.strip():
                            await read_in.send(parsed(bytes(pending)))
                        pending.clear()
                    else:
                        pending += chunk[start:]
                    if len(pending) > max_bytes:
                        log.warning("MCP server sent a message over the bound; it is stopped", server=label,
                                    bound_bytes=max_bytes)  # fmt: skip
                        on_end("too_large")
                        return  # the read side closes: the session's calls fail, the hub restarts the server
                on_end("exited")

    async def writer() -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with write_out:
                async for message in write_out:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode())

    async def stop() -> None:
        with contextlib.suppress(Exception):
            assert process.stdin is not None
            await process.stdin.aclose()
        with anyio.move_on_after(STOP_GRACE_S):
            await process.wait()
            return
        for sig in ("terminate", "kill"):
            with contextlib.suppress(ProcessLookupError, OSError):
                getattr(process, sig)()
            with anyio.move_on_after(STOP_GRACE_S):
                await process.wait()
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_out, write_in
        finally:
            with anyio.CancelScope(shield=True):
                await stop()
                for stream in (read_out, write_in, read_in, write_out):
                    await stream.aclose()
            tg.cancel_scope.cancel()
