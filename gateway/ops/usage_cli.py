"""`geniex usage`: the usage ledger as a table or JSON, read straight from its SQLite file.

It opens the file read-only, so it works beside a running server (WAL lets a reader see every
committed request without blocking the server's writes) and never creates a ledger.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys

import msgspec

from gateway.ops.ledger import UsageRow, check_day, open_readonly, query
from gateway.ops.settings import add_data_dir, default_data_dir


def add_usage_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("usage", help="requests and tokens per day, model, API key and user")
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    p.add_argument("--since", type=_day, metavar="YYYY-MM-DD", help="only days on or after this UTC date")
    p.add_argument("--model", help="only this model id")
    add_data_dir(p)
    p.set_defaults(func=_usage)


def _day(value: str) -> str:
    try:
        return check_day(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _usage(args: argparse.Namespace) -> int:
    data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
    conn = open_readonly(data_dir)
    if conn is None:
        # A server writes its ledger as soon as it starts: none here is most likely a wrong folder.
        print(
            f"error: there is no usage ledger in {data_dir} (no server has run with this --data-dir)", file=sys.stderr
        )
        return 1
    try:
        rows: list[UsageRow] = query(conn, args.since, args.model)
    except sqlite3.Error as exc:
        print(f"error: cannot read the usage ledger: {exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    if args.json:
        print(msgspec.json.encode(rows).decode())
        return 0
    if not rows:
        print("no usage recorded")
        return 0
    table = [("DAY", "MODEL", "KEY", "USER", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL")]
    table += [(r.day, r.model, r.key, r.user, str(r.requests), str(r.prompt_tokens), str(r.completion_tokens),
               str(r.total_tokens)) for r in rows]  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    numeric = range(4, 8)
    for row in table:
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())
    return 0
