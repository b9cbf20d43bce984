"""A worker's command line is declared once (protocol/worker_args.py): what the gateway writes the worker reads back."""

from __future__ import annotations

import subprocess
import sys

import pytest

from protocol import worker_args
from protocol.worker_args import WorkerArgs


def test_the_command_line_round_trips() -> None:
    args = WorkerArgs(engine="llama_cpp", model_path="/m/a b.gguf", compute="gpu", nctx=512, ngl=-1, parallel=2,
                      cache_dir="", mmproj="/m/p.gguf", cache_type_k="q8_0", cache_type_v="q4_0", name="x--cpu--512",
                      inbox="ipc://i", parent_pid=7)  # fmt: skip
    line = worker_args.argv(args)
    assert line[line.index("--cache-type-k") + 1] == "q8_0" and line[line.index("--cache-type-v") + 1] == "q4_0"
    assert worker_args.parse(line) == args
    assert worker_args.parse(["--engine", "llama_cpp", "--model-path", "m"]).cache_type_v == "f16"  # the default


@pytest.mark.parametrize(
    ("command_line", "why"),
    [
        (["--engine", "fake", "--model-path"], "pairs"),
        (["--engine", "fake", "--model-path", "m", "--nctx", "many"], "nctx"),
        (["--engine", "fake", "--model-path", "m", "--colour", "red"], "colour"),
        (["--model-path", "m"], "engine"),
        (["engine", "fake"], "option"),
    ],
)
def test_a_bad_command_line_is_refused_by_name(command_line: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        worker_args.parse(command_line)


def test_the_worker_process_refuses_a_bad_command_line_with_exit_2() -> None:
    done = subprocess.run([sys.executable, "-m", "workers", "--engine", "fake", "--model-path", "m", "--colour", "red"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "colour" in done.stderr
