"""Names given to models at run time (Ollama's `POST /api/copy`): `<data dir>/aliases.json`.

A copy is an alias, not a second file: it resolves to its model on every route, is listed by
`/api/tags` under its own name, and `DELETE /api/delete` of it removes only the name. The file
holds names only (never paths), is rewritten whole through a temporary file, and is read again
when another process changed it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec

from gateway.errors import BadRequest

# Letters, digits and . _ - / : as in model ids; a name never reads as a path (no "..", no leading "/" or ".").
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:/-]{0,127}$")
MAX_COPIES = 1024


def check_name(name: str, field: str = "destination") -> str:
    if not _NAME.match(name) or ".." in name or "//" in name:
        raise BadRequest(f"`{field}`: {name[:64]!r} is not a model name (letters, digits, '.', '_', '-', '/', ':')")
    return name


class Copies:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._given: dict[str, tuple[str, str]] = {}  # casefolded alias -> (alias as given, model id)
        self._stamp: tuple[int, int] | None = None

    def _load(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._given, self._stamp = {}, None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            raw = msgspec.json.decode(self.path.read_bytes(), type=dict[str, str])
        except (OSError, msgspec.DecodeError):
            raw = {}  # a damaged file names nothing; the next copy rewrites it
        self._given = {k.casefold(): (k, v) for k, v in raw.items() if _NAME.match(k)}
        self._stamp = stamp

    def target(self, name: str) -> str | None:
        """The model id `name` is a copy of, or None."""
        self._load()
        found = self._given.get(name.casefold())
        return found[1] if found is not None else None

    def items(self) -> list[tuple[str, str]]:
        """(alias, model id) for every copy."""
        self._load()
        return sorted(self._given.values())

    def add(self, alias: str, model_id: str) -> None:
        self._load()
        if len(self._given) >= MAX_COPIES and alias.casefold() not in self._given:
            raise BadRequest(f"at most {MAX_COPIES} copies; delete one first")
        self._given[alias.casefold()] = (alias, model_id)
        self._write()

    def remove(self, alias: str) -> bool:
        self._load()
        if self._given.pop(alias.casefold(), None) is None:
            return False
        self._write()
        return True

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(msgspec.json.encode(dict(self._given.values())))
        os.replace(tmp, self.path)
        st = self.path.stat()
        self._stamp = (st.st_mtime_ns, st.st_size)
