"""The shared log format: each record reaches stderr in one write()."""

from __future__ import annotations

import sys

import pytest
import structlog

from protocol.logs import configure_logging


class Recorder:
    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_a_record_is_one_write_ending_in_its_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway and its workers share one stderr; with PYTHONUNBUFFERED a record written as text
    then newline let another process's record land between them (seen: two JSON objects on one line)."""
    recorder = Recorder()
    monkeypatch.setattr(sys, "stderr", recorder)
    try:
        configure_logging("info", worker="w1")
        structlog.get_logger().info("one", n=1)
        structlog.get_logger().info("two", n=2)
    finally:
        structlog.reset_defaults()
    assert len(recorder.writes) == 2, recorder.writes
    assert all(w.endswith("}\n") and w.count("\n") == 1 for w in recorder.writes), recorder.writes
