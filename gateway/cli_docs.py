"""The settings table of docs/operating.md, made from `geniex serve`'s parser: each flag's name, its
`GENIEX_*` variable, its default and its help are declared once, in gateway/cli.py, and `make docs`
writes them between the table's markers. tests/unit/test_cli.py fails when the page is stale.

    python -m gateway.cli_docs docs/operating.md     # rewrite the table in place
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway import cli

BEGIN = "<!-- settings: made by `make docs` from gateway/cli.py; edit the flags' help there -->"
END = "<!-- /settings -->"


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "off"
    value = action.default
    if value is None or value == []:
        return "(none)"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`" if isinstance(value, str) else str(value)


def table(parser: argparse.ArgumentParser | None = None) -> str:
    rows = ["| flag | variable | default | meaning |", "|---|---|---|---|"]
    for action in cli.serve_flags(parser or cli.serve_parser()):
        flag = action.option_strings[0]
        meaning = " ".join((action.help or "").split()).replace("|", "\\|")
        if len(action.option_strings) > 1:  # a renamed flag: its old spelling still works, with a warning
            old = action.option_strings[1]
            meaning += f" (formerly `{old}` and `{cli.env_name(old)}`: still read, with a warning)"
        rows.append(f"| `{flag}` | `{cli.env_name(flag)}` | {_default(action)} | {meaning} |")
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
