"""Starts `geniex serve` as a subprocess and times it; reads its JSON log lines back.

Kept apart from tests/server_proc.py on purpose: the benchmark needs the spawn
instant, a tight /ready poll on one reused client (a fresh httpx client per poll
costs milliseconds of its own), and the log timestamps for the cold-start breakdown.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1
_LIVE: set[Server] = set()

_prctl: Any
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child
except (OSError, AttributeError):
    _prctl = None


def _die_with_us() -> None:
    """In the child before exec: SIGTERM it when the benchmark dies, however it dies."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@atexit.register
def stop_all(timeout: float = 10.0) -> None:
    """No server outlives the benchmark (an exception, Ctrl-C, the SIGTERM handler)."""
    for srv in list(_LIVE):
        srv.stop(timeout=timeout)


def end(proc: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM, then SIGKILL after `timeout`: a process that will not drain still goes."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `python -m gateway.cli serve` process with its own data dir and log file."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir / f"server-{self.port}.log"
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", f"127.0.0.1:{self.port}",
               "--data-dir", str(data_dir), *args]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._log = open(self.log_path, "wb")
        self.spawned_at = time.perf_counter()
        preexec = _die_with_us if sys.platform.startswith("linux") else None
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=preexec)  # fmt: skip
        self.ready_s: float | None = None
        _LIVE.add(self)

    def wait_ready(self, timeout: float = 60.0, poll_s: float = 0.005) -> float:
        """Seconds from spawn until GET /ready answers 200."""
        deadline = self.spawned_at + timeout
        with httpx.Client(timeout=1.0) as client:
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()}")
                try:
                    if client.get(f"{self.base_url}/ready").status_code == 200:
                        self.ready_s = time.perf_counter() - self.spawned_at
                        return self.ready_s
                except httpx.HTTPError:
                    pass
                time.sleep(poll_s)
        raise TimeoutError(f"server not ready in {timeout}s:\n{self.log_text()}")

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict]:
        """The JSON log lines (gateway and worker share the file); anything else is skipped."""
        out = []
        for line in self.log_text().splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ts = ev.get("timestamp")
            if isinstance(ts, str):
                try:
                    ev["_t"] = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    pass
            out.append(ev)
        return out

    def rss(self) -> dict:
        """RSS of the gateway and of each descendant (the workers), in bytes."""
        try:
            gw = psutil.Process(self.proc.pid)
            kids = gw.children(recursive=True)
            workers: dict[int, int] = {}
            out = {"gateway": gw.memory_info().rss, "workers": workers}
            for k in kids:
                try:
                    workers[k.pid] = k.memory_info().rss
                except psutil.Error:
                    pass
            return out
        except psutil.Error:
            return {"gateway": None, "workers": {}}

    def stop(self, timeout: float = 30.0) -> int | None:
        _LIVE.discard(self)
        code = end(self.proc, timeout)
        if not self._log.closed:
            self._log.close()
        return code
