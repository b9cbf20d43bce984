"""`python bench/health_probe.py URL [INTERVAL_MS]`: time GET URL every INTERVAL_MS until stdin closes.

Run as its own process so the probe is not delayed by the benchmark's own event
loop (which is busy parsing the streams under test). It speaks HTTP/1.1 over one
keep-alive socket with the request bytes built once, as curl or a Go health checker
would: httpx spent about 1 ms of Python per probe here, and its own allocation and GC
pauses showed up in the p99 of even a bare ASGI app, so it measured the client more
than the server. A few untimed probes first open the connection, then it prints `ready`.
On stdin EOF it prints one JSON line: {"samples": [[t, ms], ...], "errors": n}, where t is
`time.perf_counter()` at the probe's start (CLOCK_MONOTONIC on Linux, so the caller can
keep only the probes inside its own window).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from urllib.parse import urlsplit


class Probe:
    """One keep-alive connection; `get()` returns the status code (reconnects once if dropped)."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.addr = (u.hostname or "127.0.0.1", u.port or 80)
        self.request = f"GET {u.path or '/'} HTTP/1.1\r\nHost: {u.netloc}\r\n\r\n".encode()
        self.sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        s = socket.create_connection(self.addr, timeout=5.0)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = s
        return s

    def get(self) -> int:
        for attempt in (0, 1):
            s = self.sock or self._connect()
            try:
                s.sendall(self.request)
                return self._read(s)
            except OSError:
                s.close()
                self.sock = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def _read(s: socket.socket) -> int:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = s.recv(4096)
            if not chunk:
                raise ConnectionError("closed")
            body += chunk
        return status


def main() -> int:
    url = sys.argv[1]
    interval = (float(sys.argv[2]) if len(sys.argv) > 2 else 10.0) / 1000.0
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    samples: list[tuple[float, float]] = []
    errors = 0
    probe = Probe(url)
    for _ in range(5):
        probe.get()
    print("ready", flush=True)
    next_at = time.perf_counter()
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            ok = probe.get() == 200
        except OSError:
            ok = False
        dt = time.perf_counter() - t0
        if ok:
            samples.append((t0, dt * 1000.0))
        else:
            errors += 1
        next_at += interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            stop.wait(delay)
        else:
            next_at = time.perf_counter()  # fell behind: do not burst to catch up
    print(json.dumps({"samples": samples, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
