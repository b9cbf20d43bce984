from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.server_proc import ServerProcess
from tests.thinking_model import pull_thinking_model


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start a server of its own with these flags (ready when returned); killed after the test."""
    servers: list[ServerProcess] = []

    def make(*args: str, data_dir: Path | None = None) -> ServerProcess:
        srv = ServerProcess(data_dir or tmp_path / f"data{len(servers)}", *args)
        servers.append(srv)
        srv.wait_ready()
        return srv

    yield make
    for srv in servers:
        srv.stop(signal.SIGKILL)


@pytest.fixture(scope="session")
def thinking_model(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> str:
    """SmolLM2 under a thinking chat template (tests/thinking_model.py), in the shared server's store."""
    return pull_thinking_model(server.data_dir, tmp_path_factory.mktemp("thinking"))
