"""A failing test's report is printed, whatever it leaves behind (tests/conftest.py, AST_RECURSION_BUG).

On CPython 3.11.7, a garbage collection inside one of pytest's ast.parse calls that frees a task
whose error nobody retrieved made pytest lose the failure's report to `SystemError: AST constructor
recursion depth mismatch` (an INTERNALERROR, or a crash at session end)."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What a failing supervisor test leaves: requests' tasks whose error no one retrieved, in reference
# cycles, so that a later collection frees them and asyncio logs each error with its traceback.
LEAVES_FAILED_TASKS = """
import asyncio


async def test_fails_leaving_failed_requests_behind() -> None:
    async def request() -> None:
        raise RuntimeError("worker for test/busy:F was stopped")

    tasks = [asyncio.ensure_future(request()) for _ in range(50)]
    await asyncio.sleep(0.01)
    for task in tasks:
        holder = {"task": task}
        holder["self"] = holder
    del task, tasks, holder
    assert [1, 2, 3] == [1, 2, 4]
"""


@pytest.mark.slow
def test_a_failing_tests_report_is_printed_though_it_leaves_failed_tasks_behind(tmp_path: Path) -> None:
    """Pytest as the suite runs it (this project's settings and conftest, every installed plugin,
    schemathesis's and hypothesis's included) on one failing test."""
    test_file = tmp_path / "test_leaves_garbage.py"
    test_file.write_text(LEAVES_FAILED_TASKS)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), "--basetemp", str(tmp_path / "tmp"),
            str(test_file)]  # fmt: skip
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert "SystemError" not in out and "INTERNALERROR" not in out, out
    assert run.returncode == 1, out
    assert "= FAILURES =" in out and "_ test_fails_leaving_failed_requests_behind _" in out, out
    assert "AssertionError: assert [1, 2, 3] == [1, 2, 4]" in out or "E       assert [1, 2, 3] == [1, 2, 4]" in out, out
    assert "1 failed" in out, out


class ParsesWhenFreed:
    """As asyncio's log of a freed task's error does on 3.11: traceback parses a source line."""

    def __init__(self) -> None:
        self.me = self  # a cycle: only a collection frees it

    def __del__(self) -> None:
        ast.parse("result = (await answer(handle, ask()))[-1]", mode="exec")


def parse_amid_collections(parse: object) -> list[BaseException]:
    """Parse a large module up to 20 times, each with garbage about that collections free
    mid-parse; the first SystemError ends it."""
    source = Path(ast.__file__).read_text()
    errors: list[BaseException] = []
    threshold = gc.get_threshold()
    gc.set_threshold(100)
    try:
        for _ in range(20):
            for _ in range(200):
                ParsesWhenFreed()
            try:
                parse(source)  # type: ignore[operator]
            except SystemError as e:
                errors.append(e)
                break
    finally:
        gc.set_threshold(*threshold)
        gc.collect()
    return errors


def test_ast_parse_survives_a_finalizer_that_parses() -> None:
    assert parse_amid_collections(ast.parse) == []


@pytest.mark.skipif(
    not (3, 11) <= sys.version_info < (3, 11, 8), reason="reproduced on CPython 3.11.2 and 3.11.7; fixed in 3.11.8"
)
def test_without_the_guard_this_interpreter_loses_the_parse() -> None:
    """The interpreter bug that tests/conftest.py works around is real here (so the tests above
    test something): unguarded, a parse amid such collections fails."""
    errors = parse_amid_collections(ast.parse.__wrapped__)  # type: ignore[attr-defined]
    assert errors and "AST constructor recursion depth mismatch" in str(errors[0])
