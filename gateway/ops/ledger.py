"""The usage ledger: requests and tokens per UTC day, model, API key and `user`, in SQLite.

One row per (day, model, key, user), upserted as each request finishes, in
`<data_dir>/usage.sqlite3`. A full API key is never stored: the ledger keeps a label (8 hex
chars of its SHA-256, plus the last 4 characters of a long key so a person can match it against
their key list), enough to tell keys apart, not to recover one.

Writes happen inline on the event loop, one small transaction per finished request, on
purpose: with WAL and synchronous=NORMAL a commit appends to the WAL without an fsync (about
25 µs median on a 2-core VM), far below what a generation takes, and a request is then on disk
before its last bytes leave, so a crash or restart loses nothing that was answered. A
background batcher would save those microseconds and open a window in which answered requests
exist only in memory. The one slower write is SQLite's automatic checkpoint, every few hundred
requests, which fsyncs (4-13 ms measured); if that ever matters, checkpoint from a thread.
If another process holds the write lock past a short busy timeout, or the disk is full, the
counts stay in memory, merged, and go out with the next write that succeeds or at `close()`, which
waits longer; the loop is never blocked for more than that. Each failed write is logged and
counted (`write_failures`, exported as `geniex:usage_ledger_write_failures`), so an operator sees
a ledger that is behind before the counts are lost to a restart.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path

import msgspec
import structlog

log = structlog.get_logger("gateway.ops.ledger")

FILENAME = "usage.sqlite3"
ANONYMOUS = "anonymous"
MAX_USER_CHARS = 128
INLINE_BUSY_S = 0.05  # on the event loop: give up quickly, keep the counts, retry on the next write
CLOSE_BUSY_S = 5.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL,
    model TEXT NOT NULL,
    key TEXT NOT NULL,
    "user" TEXT NOT NULL DEFAULT '',
    requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    energy_j REAL NOT NULL DEFAULT 0,
    energy_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (day, model, key, "user")
) WITHOUT ROWID;
"""
# Added after the first ledgers were written: a ledger without them gains them when the server opens it.
_ENERGY_COLUMNS = (("energy_j", "REAL"), ("energy_tokens", "INTEGER"))
_UPSERT = """
INSERT INTO usage (day, model, key, "user", requests, prompt_tokens, completion_tokens, energy_j, energy_tokens)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (day, model, key, "user") DO UPDATE SET
    requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    energy_j = energy_j + excluded.energy_j,
    energy_tokens = energy_tokens + excluded.energy_tokens
"""

RowKey = tuple[str, str, str, str]  # day, model, key, user


class UsageRow(msgspec.Struct):
    day: str
    model: str
    key: str
    user: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # The energy of the requests whose energy was measured (gateway/ops/energy.py), and their tokens:
    # energy_j / energy_tokens is joules per token where the machine reports its draw.
    energy_j: float = 0.0
    energy_tokens: int = 0


class UsageList(msgspec.Struct):
    object: str
    data: list[UsageRow]


def key_label(authorization: str | None) -> str:
    """`Authorization: Bearer KEY` -> `sha256(KEY)[:8]`, plus `-` and KEY's last 4 chars when KEY is long."""
    if not authorization:
        return ANONYMOUS
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return ANONYMOUS
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    # A 4-char tail of a short key would give most of it away; real keys are 20+ characters.
    return f"{digest}-{key[-4:]}" if len(key) >= 16 else digest


def check_day(value: str) -> str:
    """A YYYY-MM-DD date, as `since` takes it; ValueError otherwise (rows compare as strings)."""
    try:
        if len(value) == 10 and date.fromisoformat(value).isoformat() == value:
            return value
    except ValueError:
        pass
    raise ValueError(f"{value!r} is not a date as YYYY-MM-DD")


def utc_day(ts: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if ts is None else ts))


def db_path(data_dir: Path) -> Path:
    return Path(data_dir) / FILENAME


def query(conn: sqlite3.Connection, since: str | None = None, model: str | None = None) -> list[UsageRow]:
    """Rows ordered by day, model, key, user; `since` is an inclusive YYYY-MM-DD."""
    where, args = [], []
    if since:
        where.append("day >= ?")
        args.append(since)
    if model:
        where.append("model = ?")
        args.append(model)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(usage)")}
    energy = "energy_j, energy_tokens" if "energy_j" in columns else "0.0, 0"  # a ledger older than them
    sql = f'SELECT day, model, key, "user", requests, prompt_tokens, completion_tokens, {energy} FROM usage'
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += ' ORDER BY day, model, key, "user"'
    return [
        UsageRow(d, m, k, u, r, p, c, p + c, round(j, 4), t) for d, m, k, u, r, p, c, j, t in conn.execute(sql, args)
    ]


def open_readonly(data_dir: Path) -> sqlite3.Connection | None:
    """For `geniex usage`: reads beside a running server (WAL readers never block its writes).

    None when no ledger exists yet. Read-only, so the command never creates or locks anything.
    """
    path = db_path(data_dir)
    if not path.exists():
        return None
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=CLOSE_BUSY_S)


class Ledger:
    def __init__(self, data_dir: Path) -> None:
        self.path = db_path(data_dir)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Private from the start: it names callers and users. SQLite gives its -wal and -shm files
        # the database file's mode, so those are private too.
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        os.chmod(self.path, 0o600)  # a ledger made before this rule
        self._pending: dict[RowKey, list[float]] = {}
        self.write_failures = 0  # flushes that failed (locked, disk full); their counts stayed pending
        self._conn: sqlite3.Connection | None = self._connect()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=INLINE_BUSY_S)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL under WAL: durable across process crashes (the WAL is in the OS's hands at
        # commit); only an OS crash or power cut may lose the last commits, for no fsync per request.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(usage)")}
        for name, kind in _ENERGY_COLUMNS:
            if name not in columns:
                conn.execute(f"ALTER TABLE usage ADD COLUMN {name} {kind} NOT NULL DEFAULT 0")
        return conn

    def recorder(self, model: str, caller: str, user: str | None) -> Callable[..., None]:
        """`record` for one request: its model, its caller's label (gateway/http/auth.caller_of), and
        its `user`; takes (prompt_tokens, completion_tokens, energy_j=None)."""
        return partial(self.record, model, caller, user or "")

    def record(self, model: str, key: str, user: str, prompt_tokens: int, completion_tokens: int,
               energy_j: float | None = None, *, ts: float | None = None) -> None:  # fmt: skip
        """Count one finished request and write it now (see the module docstring for why inline).
        `energy_j`: its share of the machine's energy, where measured (None: not)."""
        row = (utc_day(ts), model, key, user[:MAX_USER_CHARS])
        counts = [1, prompt_tokens, completion_tokens, energy_j or 0.0,
                  prompt_tokens + completion_tokens if energy_j is not None else 0]  # fmt: skip
        acc = self._pending.get(row)
        if acc is None:
            self._pending[row] = counts
        else:
            for i, v in enumerate(counts):
                acc[i] += v
        self.flush()

    def flush(self) -> bool:
        """Write every pending count in one transaction; False (counts kept) if the file is locked."""
        if not self._pending:
            return True
        if self._conn is None:  # a request that finished after close(): reopen rather than drop it
            self._conn = self._connect()
        items = [(*k, *v) for k, v in self._pending.items()]
        try:
            with self._conn:  # one transaction: commit on success, roll back on error
                self._conn.executemany(_UPSERT, items)
        except sqlite3.OperationalError as exc:
            self.write_failures += 1
            log.warning("usage ledger write deferred", error=str(exc), pending=len(items))
            return False
        self._pending.clear()
        return True

    def rows(self, since: str | None = None, model: str | None = None) -> list[UsageRow]:
        self.flush()
        if self._conn is None:
            self._conn = self._connect()
        return query(self._conn, since, model)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """Flush everything (waiting longer for a lock than a request would) and close."""
        if self._conn is None:
            return
        self._conn.execute(f"PRAGMA busy_timeout = {int(CLOSE_BUSY_S * 1000)}")
        if not self.flush():
            log.error("usage ledger: counts lost at shutdown", pending=self._pending)
        self._conn.close()
        self._conn = None
