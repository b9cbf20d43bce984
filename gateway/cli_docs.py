"""The settings table of docs/operating.md, made from the settings' declarations: each flag's name,
its `GENIEX_*` variable, type, default, help and the process that reads it are declared once, in
gateway/ops/settings.py, and `make docs` writes them between the table's markers. tests/unit/test_cli.py fails when the page is stale.

    python -m gateway.cli_docs docs/operating.md     # rewrite the table in place
"""

from __future__ import annotations

import sys
from pathlib import Path

from gateway import cli
from gateway.ops.settings import Setting, declared

BEGIN = "<!-- settings: made by `make docs` from gateway/ops/settings.py; edit the help there -->"
END = "<!-- /settings -->"


def _default(s: Setting) -> str:
    if s.kind is bool:
        return "off"
    value = s.default
    if value is None or value == []:
        return "(none)"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`" if isinstance(value, str) else str(value)


def _type(s: Setting) -> str:
    if s.kind is bool:
        return "switch"
    name = {Path: "path", str: "text", int: "integer", float: "number"}[s.kind]
    if s.flag.choices:
        name = "one of " + ", ".join(f"`{c}`" for c in s.flag.choices)
    if s.is_list:
        return f"{name}, comma-separated" if s.flag.csv else f"{name}, repeatable"
    return name


def table() -> str:
    rows = ["| flag | variable | type | default | read by | meaning |", "|---|---|---|---|---|---|"]
    for s in declared():
        meaning = " ".join(s.flag.help.split()).replace("|", "\\|")
        if s.flag.old:  # a renamed flag: its old spelling still works, with a warning
            meaning += f" (formerly `{s.flag.old}` and `{cli.env_name(s.flag.old)}`: still read, with a warning)"
        rows.append(
            f"| `{s.option}` | `{cli.env_name(s.option)}` | {_type(s)} | {_default(s)} | {s.flag.reads} | {meaning} |"
        )
    return "\n".join(rows)


def with_table(page: str) -> str:
    """`page` with the text between its markers replaced by the current table."""
    head, found, rest = page.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise ValueError(f"the page has no {BEGIN!r} ... {END!r} markers")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    for name in argv or ["docs/operating.md"]:
        path = Path(name)
        path.write_text(with_table(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
