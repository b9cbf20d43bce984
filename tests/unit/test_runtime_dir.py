"""The sweep of runtime folders left by gateways that died without cleaning up (SIGKILL, OOM)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.supervisor import runtime_dir


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_only_this_users_folders_of_dead_gateways(tmp_path: Path) -> None:
    mine = runtime_dir.create(tmp_path)
    (mine / "w.in").touch()
    dead = tmp_path / f"geniex-{dead_pid()}-abc123"
    (dead / "sub").mkdir(parents=True)
    alive = tmp_path / f"geniex-{os.getppid()}-xyz"  # a running process: never touched
    alive.mkdir()
    unrelated = tmp_path / "geniex-notapid-x"
    unrelated.mkdir()
    a_file = tmp_path / f"geniex-{dead_pid()}-file"
    a_file.write_text("not a folder")

    assert runtime_dir.sweep(tmp_path) == [dead]
    assert not dead.exists()
    assert mine.is_dir() and (mine / "w.in").exists()
    assert alive.is_dir() and unrelated.is_dir() and a_file.is_file()
    assert mine.name.startswith(f"geniex-{os.getpid()}-") and oct(mine.stat().st_mode & 0o777) == "0o700"


def test_sweep_of_a_missing_base_is_harmless(tmp_path: Path) -> None:
    assert runtime_dir.sweep(tmp_path / "nope") == []


def test_a_folder_whose_socket_still_answers_is_kept(tmp_path: Path) -> None:
    import socket

    live = tmp_path / f"geniex-{dead_pid()}-ns"  # e.g. a gateway in another pid namespace
    live.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(live / "w.out"))
        srv.listen()
        assert runtime_dir.sweep(tmp_path) == []
    assert live.is_dir()
    assert runtime_dir.sweep(tmp_path) == [live]  # closed: the socket file is left, nobody listens
