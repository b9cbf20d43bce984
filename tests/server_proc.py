"""Starts the real `geniex serve` as a subprocess for integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A port drawn by free_port() is free when drawn, not when the server binds it: another test
# process (make test runs two) may take it in between. Then the server exits saying so, and
# wait_ready starts it again on another port, this many times at most.
PORT_RETRIES = 3
PORT_TAKEN = "the address is already in use"


class ServerProcess:
    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None, python: str = "") -> None:
        self.data_dir = data_dir
        self.python = python or sys.executable  # another venv's (the Vulkan build's: tests/integration/test_gpu.py)
        self._args = args
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        # With --certfile, the certificate is also what clients trust (the tests' own, self-signed).
        self.verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=args[args.index("--certfile") + 1]) if "--certfile" in args else True
        )
        data_dir.mkdir(parents=True, exist_ok=True)
        self._spawn()
        STARTED.append(self)

    def _spawn(self) -> None:
        self.port = free_port()
        self.base_url = f"{'https' if '--certfile' in self._args else 'http'}://127.0.0.1:{self.port}"
        self.log_path = self.data_dir / f"server-{self.port}.log"
        cmd = [self.python, "-m", "gateway.cli", "serve", "--host", f"127.0.0.1:{self.port}",
               "--data-dir", str(self.data_dir), *self._args]  # fmt: skip
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self._env)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        retries = PORT_RETRIES
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if retries and PORT_TAKEN in self.log():
                    retries -= 1
                    self._log.close()
                    self._spawn()
                    continue
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/ready", timeout=1, verify=self.verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int, limit: int = 64 << 10) -> str:
        """What the server logged from byte `offset` on, its last `limit` bytes at most."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(max(offset, self.log_size() - limit))
                return fh.read().decode(errors="replace")
        except OSError as exc:
            return f"(the log {self.log_path} could not be read: {exc})"

    def worker_pids(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


# Every server this test process started, for the failure reports (tests/conftest.py).
STARTED: list[ServerProcess] = []


@contextlib.contextmanager
def serving(data_dir: Path, *args: str, env: dict[str, str] | None = None, python: str = "") -> Iterator[ServerProcess]:
    """A server started and ready for the block (a module fixture's body); stopped after it."""
    srv = ServerProcess(data_dir, *args, env=env, python=python)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()
