"""The real server under systemd's eyes: notifications on a fake NOTIFY_SOCKET, the workers'
OOM score, and (where systemd is PID 1) the unit in deploy/ started by a real service manager."""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess, free_port

LONG = [{"role": "user", "content": "Write a very long story about a dragon who learns to code."}]
REPO = Path(__file__).resolve().parents[2]


class NotifySocket:
    """A datagram socket standing in for systemd's notification socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.seen: list[str] = []

    def wait_for(self, message: str, count: int = 1, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.seen.count(message) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{count} × {message} not received in {timeout:g}s; got {self.seen}")
            self.sock.settimeout(left)
            try:
                self.seen.append(self.sock.recv(4096).decode())
            except TimeoutError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify")
    yield sock
    sock.close()


def test_the_gateway_notifies_ready_pings_the_watchdog_and_says_stopping_when_the_drain_starts(
    tmp_path: Path, notify: NotifySocket
) -> None:
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"}  # a ping every second
    srv = ServerProcess(tmp_path / "data", "--nctx", "512", "--drain-timeout-s", "60", env=env)
    try:
        notify.wait_for("READY=1")
        srv.wait_ready()
        notify.wait_for("WATCHDOG=1", count=2)
        assert "STOPPING=1" not in notify.seen

        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        stream = iter(client.chat.completions.create(model=MODEL, messages=LONG, stream=True, max_tokens=300))
        next(stream)
        srv.proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1")
        # STOPPING=1 came when the drain began, not after it: the server still answers, draining.
        assert httpx.get(f"{srv.base_url}/ready", timeout=10).status_code == 503
        assert list(stream)[-1].choices[0].finish_reason == "length"
        assert srv.proc.wait(120) == 0  # the drain, then the workers stop (slow on a loaded 2-core box)
        assert notify.seen.count("READY=1") == 1 and notify.seen.count("STOPPING=1") == 1
        assert set(notify.seen) == {"READY=1", "WATCHDOG=1", "STOPPING=1"}, "workers send nothing"
    finally:
        srv.stop(signal.SIGKILL)


def _oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="no /proc/<pid>/oom_score_adj (not Linux)")
def test_a_worker_is_offered_to_the_oom_killer_before_the_gateway(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data", "--nctx", "512", "--preload", MODEL)
    try:
        srv.wait_ready()
        pids = [w["pid"] for w in httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"]]
        assert len(pids) == 1
        gateway, worker = _oom_score_adj(srv.proc.pid), _oom_score_adj(pids[0])
        assert worker == min(1000, gateway + 500)
        assert worker > gateway
    finally:
        srv.stop()


# ---- under a real systemd -------------------------------------------------------------------


def _why_no_systemd() -> str | None:
    """None when systemd manages this machine (sd_booted(3): /run/systemd/system exists)."""
    if Path("/run/systemd/system").is_dir():
        return None
    try:
        init = Path("/proc/1/comm").read_text().strip()
    except OSError:
        init = "unknown"
    return (f"PID 1 is {init!r}, not systemd (a container or a machine without systemd): there is no service "
            "manager to run deploy/geniex.service under; it runs where systemd is the init")  # fmt: skip


def _systemctl(system: bool, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = ["systemctl", *([] if system else ["--user"]), "--no-pager", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _show(system: bool, unit: str, *props: str) -> dict[str, str]:
    out = _systemctl(system, "show", unit, *(f"--property={p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _unit_for_test(text: str, name: str, port: int, system: bool, data_dir: Path) -> str:
    """The deploy unit as a throwaway test service: this checkout's interpreter, a port, its own
    state and cache directories, a 2 s watchdog, and no /etc/geniex/geniex.env."""
    cmd = f"{sys.executable} -m gateway.cli serve --host 127.0.0.1:{port} --nctx 512"
    text = re.sub(r"(?m)^ExecStart=.*$", f"ExecStart={cmd}", text)
    text = re.sub(r"(?m)^EnvironmentFile=.*\n", "", text)
    text = re.sub(r"(?m)^WatchdogSec=.*$", "WatchdogSec=2s", text)
    text = re.sub(r"(?m)^(StateDirectory|CacheDirectory)=geniex$", rf"\1={name}", text)
    text = text.replace("%S/geniex", f"%S/{name}").replace("%C/geniex", f"%C/{name}")
    if system:
        # No account to create: a dynamic user. ProtectHome=yes would hide a checkout or an
        # interpreter under /home or /root, so those are bound in read-only over an empty /home.
        text = re.sub(r"(?m)^(User|Group)=geniex\n", "", text).replace("[Service]\n", "[Service]\nDynamicUser=yes\n")
        paths = sorted({str(REPO), os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)})
        text = re.sub(r"(?m)^ProtectHome=yes$", "ProtectHome=tmpfs\nBindReadOnlyPaths=" + " ".join(paths), text)
    else:
        text = text.replace("[Service]\n", f"[Service]\nEnvironment=GENIEX_DATA_DIR={data_dir}\n")
    return text


@pytest.mark.skipif(_why_no_systemd() is not None, reason=_why_no_systemd() or "")
def test_the_unit_runs_under_systemd(tmp_path: Path) -> None:
    system = os.geteuid() == 0
    if system:
        source, unit_dir = REPO / "deploy" / "geniex.service", Path("/run/systemd/system")
    else:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if not runtime or _systemctl(False, "is-system-running").stdout.strip() in ("", "offline"):
            pytest.skip("not root, and no user service manager (systemctl --user) to run the user unit under")
        source, unit_dir = REPO / "deploy" / "geniex-user.service", Path(runtime) / "systemd" / "user"
    name = f"geniex-test-{secrets.token_hex(4)}"
    unit = f"{name}.service"
    port = free_port()
    unit_dir.mkdir(parents=True, exist_ok=True)
    path = unit_dir / unit
    path.write_text(_unit_for_test(source.read_text(), name, port, system, tmp_path / "data"))
    _systemctl(system, "daemon-reload")
    try:
        started = _systemctl(system, "start", unit, timeout=300)  # returns at READY=1 (Type=notify)

        def journal() -> str:
            cmd = ["journalctl", "--system" if system else "--user", "-u", unit, "--no-pager", "-n", "80"]
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout

        assert started.returncode == 0, started.stderr + journal()
        state = _show(system, unit, "ActiveState", "SubState", "MainPID", "WatchdogTimestampMonotonic")
        assert (state["ActiveState"], state["SubState"]) == ("active", "running"), journal()
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/ready", timeout=10).status_code == 200

        # A worker runs inside the sandbox (seccomp, MemoryDenyWriteExecute, PrivateDevices...).
        r = httpx.post(f"{base}/v1/chat/completions", timeout=300,
                       json={"model": MODEL, "messages": LONG, "max_tokens": 8})  # fmt: skip
        assert r.status_code == 200, r.text + journal()
        worker = httpx.get(f"{base}/v1/workers", timeout=10).json()["data"][0]["pid"]
        assert _oom_score_adj(worker) > _oom_score_adj(int(state["MainPID"]))

        # systemd records each WATCHDOG=1: the timestamp moves on while the service runs.
        first = state["WatchdogTimestampMonotonic"]
        deadline = time.monotonic() + 30
        while _show(system, unit, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"] == first:
            assert time.monotonic() < deadline, "no watchdog ping reached systemd in 30 s"
            time.sleep(0.2)

        stopped = _systemctl(system, "stop", unit, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        after = _show(system, unit, "Result", "ExecMainStatus", "NRestarts")
        assert after == {"Result": "success", "ExecMainStatus": "0", "NRestarts": "0"}, journal()
    finally:
        _systemctl(system, "stop", unit, timeout=120)
        path.unlink(missing_ok=True)
        _systemctl(system, "reset-failed", unit)
        _systemctl(system, "daemon-reload")
