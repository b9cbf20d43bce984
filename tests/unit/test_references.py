"""Comments, docstrings and docs that name a file of this project name one that exists: a path
that moved or was never written misleads the next reader. `module.name`
(a function in a module) counts when the module exists; a model id (`bench/pipeline:default`)
is not a path; bench/results/ is what the benchmarks write."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("gateway", "workers", "protocol", "tests", "bench", "deploy", "docs", ".ci")
SUFFIXES = {".py", ".md", ".sh", ".service", ".toml", ".html", ".js", ".css", ".yaml"}
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(r) for r in ROOTS) + r")/[\w./-]*[\w/])(:?)")
GENERATED = ("bench/results/",)


def _files() -> list[Path]:
    found = [REPO / "README.md", REPO / "Makefile", REPO / "pyproject.toml"]
    for root in ROOTS:
        found += [p for p in (REPO / root).rglob("*") if p.suffix in SUFFIXES and p.is_file()
                  and "vendor" not in p.parts and "contract" not in p.parts]  # fmt: skip
    return found


def _exists(ref: str) -> bool:
    path = REPO / ref
    if path.exists() or path.with_name(path.name + ".py").exists():
        return True
    module, _, _attr = ref.rpartition(".")  # gateway/http/auth.caller_of
    return bool(module) and (REPO / (module + ".py")).exists()


def test_every_named_file_exists() -> None:
    broken: list[str] = []
    for f in _files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in PATH.finditer(line):
                ref, colon = m.group(1).rstrip("."), m.group(2)
                if ref.startswith(GENERATED) or (colon and "." not in ref.rpartition("/")[2]):
                    continue
                if not _exists(ref):
                    broken.append(f"{f.relative_to(REPO)}:{n}: {ref}")
    assert not broken, "\n".join(broken)
