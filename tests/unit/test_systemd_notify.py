"""systemd notifications, the drain hook that sends STOPPING=1, and the workers' OOM score."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.http.lifecycle import Lifecycle
from gateway.ops.systemd import Systemd, watchdog_interval
from workers.__main__ import _offer_to_oom_killer


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0


@pytest.mark.parametrize("environ", [{}, {"WATCHDOG_USEC": "0"}, {"WATCHDOG_USEC": "soon"}, {"WATCHDOG_USEC": "-5"}])
def test_no_watchdog_without_a_usable_watchdog_usec(environ: dict[str, str]) -> None:
    assert watchdog_interval(environ) is None


def test_watchdog_pid_names_the_process_to_ping_from() -> None:
    env = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "4242"}
    assert watchdog_interval(env, pid=4242) == 1.0
    assert watchdog_interval(env, pid=4243) is None, "inherited from a parent that systemd watches"


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket standing in for systemd's, named by NOTIFY_SOCKET."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(10)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


async def test_ready_stopping_once_and_watchdog_pings(
    notify_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "20000")  # a ping every 10 ms
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    sd = Systemd()
    sd.ready()
    assert notify_socket.recv(256) == b"READY=1"
    sd.start_watchdog()
    pings = [await asyncio.to_thread(notify_socket.recv, 256) for _ in range(3)]
    assert pings == [b"WATCHDOG=1"] * 3
    await sd.close()
    sd.stopping()  # after close: nothing is sent, nothing raises
    notify_socket.setblocking(False)
    while True:  # pings sent before close may still be queued; nothing else is
        try:
            assert notify_socket.recv(256) == b"WATCHDOG=1"
        except BlockingIOError:
            break


async def test_stopping_is_sent_once(notify_socket: socket.socket) -> None:
    sd = Systemd()
    sd.stopping()
    sd.stopping()
    sd.ready()
    assert notify_socket.recv(256) == b"STOPPING=1"
    assert notify_socket.recv(256) == b"READY=1"
    await sd.close()


async def test_a_no_op_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "20000")
    sd = Systemd()
    sd.start_watchdog()
    sd.ready()
    sd.stopping()
    assert sd._watchdog is None
    await sd.close()


def test_the_drain_hook_runs_once_when_draining_starts() -> None:
    lifecycle = Lifecycle()
    calls: list[str] = []
    lifecycle.on_drain.append(lambda: calls.append("drain"))
    lifecycle.draining = False
    assert calls == []
    lifecycle.draining = True
    lifecycle.draining = True  # a second signal
    assert calls == ["drain"] and lifecycle.draining


@pytest.mark.parametrize(("before", "after"), [("0", "500"), ("-100", "400"), ("800", "1000"), ("1000", "1000")])
def test_a_worker_raises_its_oom_score_adj_by_500(tmp_path: Path, before: str, after: str) -> None:
    path = tmp_path / "oom_score_adj"
    path.write_text(before + "\n")
    _offer_to_oom_killer(path=str(path))
    assert path.read_text() == after


def test_no_proc_is_not_an_error(tmp_path: Path) -> None:
    _offer_to_oom_killer(path=str(tmp_path / "absent" / "oom_score_adj"))


async def test_a_reader_that_falls_behind_never_blocks_the_event_loop(notify_socket: socket.socket) -> None:
    """The kernel queues about 10 datagrams for an unread socket; sending blocked after that, and
    with it the whole gateway (found as a hang of the drain test on a loaded box)."""
    systemd = Systemd()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for _ in range(200):
        systemd._send("WATCHDOG=1")
    assert loop.time() - t0 < 1.0
    assert notify_socket.recv(64) == b"WATCHDOG=1"
    await systemd.close()
