"""The rule between the code's rooms (docs/architecture.md, "The rooms"), read from the imports.

`gateway/` and `workers/` never import each other; both import `protocol/`, which imports
neither. Inside the gateway imports point down the floors below, never up or sideways across a
floor's rooms, and one protocol's room (`gateway/dialects/<protocol>/`) never imports another's:
adding or changing a dialect opens its own room and nothing else.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Top floor first. A room may import a room of a lower floor; rooms of one floor import each other
# only where ALSO_ALLOWED says so.
FLOORS: list[set[str]] = [
    {"cli_docs"},
    {"cli"},
    {"app"},
    {"dialects"},  # one room per protocol: gateway/dialects/<protocol>/
    {"http"},  # the plumbing every route shares
    {"chat", "supervisor", "doctor"},  # the shared chat plan; the workers; `geniex doctor`
    {"models", "mcp", "media"},
    {"ops"},
    {"errors", "web"},
]
ALSO_ALLOWED: set[tuple[str, str]] = set()


def _room(module: str) -> str:
    """gateway.dialects.ollama.chat -> dialects.ollama; gateway.http.relay -> http; gateway.cli -> cli."""
    parts = module.split(".")
    if parts[1] == "dialects" and len(parts) > 2:
        return f"dialects.{parts[2]}"
    return parts[1]


def _floor(room: str) -> int:
    name = room.split(".")[0]
    return next(i for i, rooms in enumerate(FLOORS) if name in rooms)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every absolute import in `path`, a `from pkg import mod` as pkg.mod too."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _is_module(module: str) -> bool:
    """A module or package of this tree (not a name taken from one)."""
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_gateway_workers_and_protocol_import_as_the_design_says() -> None:
    refused = {"gateway": ("workers",), "workers": ("gateway",), "protocol": ("gateway", "workers")}
    broken = [f"{_module(p)}:{line} imports {m}"
              for package, never in refused.items() for p in _sources(package)
              for line, m in _imports(p) if m.split(".")[0] in never]  # fmt: skip
    assert not broken, "\n".join(broken)


def test_every_gateway_room_is_on_a_floor() -> None:
    rooms = {_room(_module(p)) for p in _sources("gateway") if _module(p) != "gateway"}
    assert rooms, "no gateway sources found"
    unplaced = sorted(r for r in rooms if not any(r.split(".")[0] in f for f in FLOORS))
    assert not unplaced, f"rooms on no floor (place them in FLOORS and in docs/architecture.md): {unplaced}"


def test_gateway_imports_point_down_and_no_dialect_imports_another() -> None:
    broken = []
    for path in _sources("gateway"):
        here = _module(path)
        if here == "gateway":
            continue
        mine = _room(here)
        for line, target in _imports(path):
            if not target.startswith("gateway.") or not _is_module(target):
                continue
            theirs = _room(target)
            if theirs == mine or (mine, theirs) in ALSO_ALLOWED:
                continue
            if mine.startswith("dialects.") and theirs.startswith("dialects."):
                broken.append(f"{here}:{line} imports {target}: one dialect's room imports another's")
            elif _floor(theirs) <= _floor(mine):
                broken.append(f"{here}:{line} imports {target}: {theirs} is not below {mine}")
    assert not broken, "\n".join(broken)


def test_the_rule_sees_a_broken_import() -> None:
    """The check above reads what it should: an import up, and one across dialects, are both found."""
    assert _floor(_room("gateway.http.relay")) < _floor(_room("gateway.chat.convert"))
    assert _floor(_room("gateway.dialects.ollama.chat")) < _floor(_room("gateway.http.relay"))
    assert _room("gateway.dialects.ollama.chat") != _room("gateway.dialects.openai.chat")
    assert _is_module("gateway.http.relay") and not _is_module("gateway.http.relay.relay_stream")
    lines = {m for _, m in _imports(ROOT / "gateway" / "cli_docs.py")}
    assert "gateway.cli" in lines  # `from gateway import cli` is an import of gateway.cli
