"""The project keeps its own copy of the API spec (tests/fuzz/contract), so that a clone without
../shared beside it runs the fuzz and schema tests too. Where ../shared/spec is there (CI, a
developer's machine), the copy must be the same, file for file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.spec import CONTRACT, SHARED


def test_the_contract_copy_is_the_shared_spec() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is not beside this checkout: the copy in {CONTRACT} is the contract")
    shared = {p.name: p.read_bytes() for p in SHARED.iterdir() if p.is_file()}
    copy = {p.name: p.read_bytes() for p in CONTRACT.iterdir() if p.is_file()}
    stale = sorted(name for name in shared.keys() | copy.keys() if shared.get(name) != copy.get(name))
    assert not stale, f"{', '.join(stale)} differ from {SHARED}: run `cp {SHARED}/* {CONTRACT}/`"


def test_a_checkout_alone_runs_the_spec_tests(tmp_path: Path) -> None:
    """The tests that read the spec, in a copy of the checkout with nothing beside it."""
    repo = Path(__file__).resolve().parents[2]
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, check=True,
                           capture_output=True).stdout.decode().split("\0")  # fmt: skip
    alone = tmp_path / "alone" / "main"
    for name in filter(None, files):
        if (repo / name).is_file():
            (alone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, alone / name)
    assert not (alone.parent / "shared").exists()
    env = {k: v for k, v in os.environ.items() if k != "GENIEX_SPEC_DIR"}
    load = subprocess.run([sys.executable, "-c", "from tests.fuzz.spec import load_spec; print(len(load_spec()['paths']))"],
                          cwd=alone, env=env, capture_output=True, text=True)  # fmt: skip
    assert load.returncode == 0 and int(load.stdout) > 3, load.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_webui.py",
                          "tests/fuzz/test_transcription.py", "tests/unit/test_contract_copy.py", "-k", "not alone"],
                         cwd=alone, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    assert " skipped" in run.stdout.splitlines()[-1] and "passed" in run.stdout.splitlines()[-1]
