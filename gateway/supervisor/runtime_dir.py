"""The gateway's private folder for its ZeroMQ ipc sockets, and the sweep of dead gateways' folders.

ipc paths must stay under ~100 bytes, so the folder lives in $XDG_RUNTIME_DIR or the temp dir,
not the data dir. The gateway removes it when it stops, but a gateway killed with SIGKILL (or by
the OOM killer) cannot; its folder names its pid, so the next gateway started by the same user
removes the folders of gateways that are no longer running.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

import psutil

PREFIX = "geniex-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-[A-Za-z0-9_]+$")


def base_dir() -> Path:
    return Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())


def create(base: Path | None = None) -> Path:
    """A fresh 0700 folder named after this process."""
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base or base_dir()))


def _answers(folder: Path) -> bool:
    """Does any unix socket in `folder` still accept a connection?"""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return False
    for entry in entries:
        if not entry.is_socket():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(entry))
                return True
            except OSError:
                pass
    return False


def sweep(base: Path | None = None) -> list[Path]:
    """Remove this user's folders whose gateway is gone; returns what was removed.

    A pid that is alive is left alone even if it now belongs to another program: a stale
    folder costs a few bytes, removing a live gateway's sockets would cut it off its workers.
    So is a folder whose sockets still accept a connection (a gateway in another pid
    namespace sharing this temp dir).
    """
    removed: list[Path] = []
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        entries = list((base or base_dir()).iterdir())
    except OSError:
        return removed
    for path in entries:
        m = _NAME.match(path.name)
        if m is None or int(m.group(1)) == os.getpid():
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        if not path.is_dir() or path.is_symlink() or (uid is not None and st.st_uid != uid):
            continue
        if psutil.pid_exists(int(m.group(1))) or _answers(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
