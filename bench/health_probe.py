"""`python bench/health_probe.py URL [INTERVAL_MS]`: time GET URL every INTERVAL_MS until stdin closes.

Run as its own process so the probe is not delayed by the benchmark's own event
loop (which is busy parsing the streams under test). One keep-alive httpx
client; a few untimed probes first open the connection, then it prints `ready`.
On stdin EOF it prints one JSON line: {"samples": [[t, ms], ...], "errors": n}, where t is
`time.perf_counter()` at the probe's start (CLOCK_MONOTONIC on Linux, so the caller can
keep only the probes inside its own window).
"""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx


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
    with httpx.Client(timeout=5.0) as client:
        for _ in range(5):
            client.get(url)
        print("ready", flush=True)
        next_at = time.perf_counter()
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                ok = client.get(url).status_code == 200
            except httpx.HTTPError:
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
