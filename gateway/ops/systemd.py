"""What the gateway tells systemd (`Type=notify`): READY=1, STOPPING=1, and WATCHDOG=1.

sdnotify speaks the protocol; this module decides when. Everything is a no-op unless systemd
started the process with a notification socket (NOTIFY_SOCKET). The watchdog is pinged from a
task on the server's own event loop, so a loop wedged by blocking code stops the pings and
systemd kills and restarts the service (`WatchdogSec=`, `Restart=on-failure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping

import structlog
from sdnotify import SystemdNotifier

log = structlog.get_logger("gateway.systemd")


def watchdog_interval(environ: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """Seconds between pings: half of WATCHDOG_USEC, as sd_watchdog_enabled(3) advises. None when
    systemd wants no pings from this process: no watchdog, or WATCHDOG_PID names another process
    (the variables were inherited from a parent that systemd does watch)."""
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    owner = environ.get("WATCHDOG_PID")
    if usec <= 0 or (owner and owner != str(pid if pid is not None else os.getpid())):
        return None
    return usec / 2e6


class Systemd:
    """The service manager's view of this server. Methods may be called whether or not systemd
    is there; `stopping` only sends once however many times it is called (drain, then shutdown)."""

    def __init__(self) -> None:
        self._notifier = SystemdNotifier() if os.environ.get("NOTIFY_SOCKET") else None
        if self._notifier is not None and self._notifier.socket is not None:
            # sdnotify sends blocking, from the event loop: a reader that falls behind (the kernel
            # queues 10 datagrams, net.unix.max_dgram_qlen) would wedge every request. Non-blocking,
            # a ping is dropped instead; the next one follows within WatchdogSec/2.
            self._notifier.socket.setblocking(False)
        self._stopping = False
        self._watchdog: asyncio.Task[None] | None = None

    def ready(self) -> None:
        self._send("READY=1")

    def stopping(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._send("STOPPING=1")

    def start_watchdog(self) -> None:
        """Ping from the running loop until `close`, if systemd asked for a watchdog."""
        interval = watchdog_interval()
        if self._notifier is None or interval is None or self._watchdog is not None:
            return
        log.debug("systemd watchdog", ping_every_s=interval)
        self._watchdog = asyncio.create_task(self._ping(interval), name="systemd-watchdog")

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        if self._notifier is not None and self._notifier.socket is not None:
            self._notifier.socket.close()
        self._notifier = None

    async def _ping(self, interval: float) -> None:
        while True:
            self._send("WATCHDOG=1")
            await asyncio.sleep(interval)

    def _send(self, state: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(state)  # errors are swallowed by sdnotify: systemd may be gone
