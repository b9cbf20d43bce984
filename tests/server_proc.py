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


class ServerProcess:
    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        # With --certfile, the certificate is also what clients trust (the tests' own, self-signed).
        self.verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=args[args.index("--certfile") + 1]) if "--certfile" in args else True
        )
        self.base_url = f"{'https' if '--certfile' in args else 'http'}://127.0.0.1:{self.port}"
        self.log_path = data_dir / f"server-{self.port}.log"
        data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", f"127.0.0.1:{self.port}",
               "--data-dir", str(data_dir), *args]  # fmt: skip
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
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


@contextlib.contextmanager
def serving(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """A server started and ready for the block (a module fixture's body); stopped after it."""
    srv = ServerProcess(data_dir, *args, env=env)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()
