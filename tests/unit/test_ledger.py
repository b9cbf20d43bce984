"""The usage ledger: SQLite upserts, day rollover, key labels, WAL, and readers beside a writer."""

from __future__ import annotations

import calendar
import sqlite3
import time
from pathlib import Path

from gateway.ops.ledger import (
    ANONYMOUS,
    Ledger,
    db_path,
    key_label,
    open_readonly,
    query,
    utc_day,
)

KEY = "sk-test-0123456789abcdefWXYZ"
MODEL = "org/model:Q4_0"


def ts(day: str, hms: str = "12:00:00") -> float:
    return float(calendar.timegm(time.strptime(f"{day} {hms}", "%Y-%m-%d %H:%M:%S")))


def totals(rows: list) -> tuple[int, int, int]:  # type: ignore[type-arg]
    return sum(r.requests for r in rows), sum(r.prompt_tokens for r in rows), sum(r.completion_tokens for r in rows)


def test_key_label_is_short_stable_and_not_the_key() -> None:
    label = key_label(f"Bearer {KEY}")
    assert label == key_label(f"bearer  {KEY} ")  # scheme is case-insensitive, spaces trimmed
    digest, tail = label.split("-")
    assert len(digest) == 8 and int(digest, 16) >= 0 and tail == "WXYZ"
    assert KEY not in label and label != key_label("Bearer sk-test-0123456789abcdefWXYz")
    assert "-" not in key_label("Bearer short") and len(key_label("Bearer short")) == 8  # no tail for short keys
    for header in (None, "", "Bearer", "Bearer   ", f"Basic {KEY}"):
        assert key_label(header) == ANONYMOUS


def test_upsert_aggregates_per_day_model_key_user(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    t = ts("2026-03-01")
    led.record(MODEL, "k1", "", 10, 5, ts=t)
    led.record(MODEL, "k1", "", 12, 7, ts=t + 60)
    led.record(MODEL, "k1", "alice", 1, 1, ts=t)
    led.record(MODEL, "k2", "", 3, 4, ts=t)
    led.record("other/model:Q8_0", "k1", "", 2, 2, ts=t)
    rows = led.rows()
    assert [
        (r.model, r.key, r.user, r.requests, r.prompt_tokens, r.completion_tokens, r.total_tokens) for r in rows
    ] == [
        (MODEL, "k1", "", 2, 22, 12, 34),
        (MODEL, "k1", "alice", 1, 1, 1, 2),
        (MODEL, "k2", "", 1, 3, 4, 7),
        ("other/model:Q8_0", "k1", "", 1, 2, 2, 4),
    ]
    assert [r.model for r in led.rows(model="other/model:Q8_0")] == ["other/model:Q8_0"]
    led.close()


def test_day_rollover_is_utc_and_since_filters(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.record(MODEL, "k", "", 1, 1, ts=ts("2026-03-01", "23:59:59"))
    led.record(MODEL, "k", "", 2, 2, ts=ts("2026-03-02", "00:00:00"))
    led.record(MODEL, "k", "", 3, 3, ts=ts("2026-03-02", "23:00:00"))
    assert [(r.day, r.requests, r.prompt_tokens) for r in led.rows()] == [("2026-03-01", 1, 1), ("2026-03-02", 2, 5)]
    assert [r.day for r in led.rows(since="2026-03-02")] == ["2026-03-02"]
    assert led.rows(since="2026-03-03") == []
    assert utc_day(ts("2026-12-31", "23:30:00")) == "2026-12-31"
    led.close()


def test_wal_mode_and_normal_sync(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.record(MODEL, "k", "", 1, 1)
    other = sqlite3.connect(db_path(tmp_path))
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent in the file
    assert led._conn is not None and led._conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    other.close()
    led.close()


def test_survives_close_and_reopen_and_never_stores_the_key(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.record(MODEL, key_label(f"Bearer {KEY}"), "bob", 7, 3)
    led.close()
    led.record(MODEL, ANONYMOUS, "", 1, 1)  # a request that finished after close() still counts
    led.close()
    again = Ledger(tmp_path)
    assert totals(again.rows()) == (2, 8, 4)
    again.close()
    for f in tmp_path.iterdir():
        assert KEY.encode() not in f.read_bytes()


def test_concurrent_connections(tmp_path: Path) -> None:
    a, b = Ledger(tmp_path), Ledger(tmp_path)
    reader = open_readonly(tmp_path)
    assert reader is not None
    for i in range(20):
        (a if i % 2 else b).record(MODEL, "k", "", 1, 2)
        assert totals(query(reader)) == (i + 1, (i + 1), 2 * (i + 1))  # each commit visible at once
    # A reader inside a long read transaction does not block writers (WAL), and keeps its snapshot.
    reader.execute("BEGIN")
    snapshot = totals(query(reader))
    a.record(MODEL, "k", "", 1, 1)
    assert a.pending == 0 and totals(query(reader)) == snapshot
    reader.execute("COMMIT")
    assert totals(query(reader)) == (21, 21, 41)
    reader.close()
    a.close()
    b.close()


def test_locked_by_another_writer_keeps_counts_and_flushes_later(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    blocker = sqlite3.connect(db_path(tmp_path), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # holds the write lock
    led.record(MODEL, "k", "", 5, 5)  # must neither raise nor wait long
    led.record(MODEL, "k", "", 5, 5)
    assert led.pending == 1
    blocker.execute("ROLLBACK")
    blocker.close()
    led.record(MODEL, "k", "", 1, 1)
    assert led.pending == 0
    assert totals(led.rows()) == (3, 11, 11)
    # close() flushes what is pending too
    blocker = sqlite3.connect(db_path(tmp_path), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    led.record(MODEL, "k", "", 1, 1)
    blocker.execute("ROLLBACK")
    blocker.close()
    led.close()
    reader = open_readonly(tmp_path)
    assert reader is not None and totals(query(reader)) == (4, 12, 12)
    reader.close()


def test_readonly_open_of_missing_or_cleanly_closed_ledger(tmp_path: Path) -> None:
    assert open_readonly(tmp_path / "nothing-here") is None
    led = Ledger(tmp_path)
    led.record(MODEL, "k", "u", 2, 3)
    led.close()  # a clean close checkpoints and removes -wal/-shm
    reader = open_readonly(tmp_path)
    assert reader is not None
    assert [(r.user, r.total_tokens) for r in query(reader)] == [("u", 5)]
    reader.close()


def test_the_ledger_is_private_to_the_server_user(tmp_path: Path) -> None:
    """It names callers and users: 0600 (its WAL and shm files take its mode), in a 0700 folder
    when the server creates that folder; a ledger made before this rule is made private too."""
    data = tmp_path / "data"
    led = Ledger(data)
    led.record(MODEL, "k", "alice", 1, 1)
    modes = {p.name: p.stat().st_mode & 0o777 for p in data.iterdir()}
    assert data.stat().st_mode & 0o777 == 0o700
    assert modes and all(mode == 0o600 for mode in modes.values()), modes
    led.close()
    db_path(data).chmod(0o644)
    Ledger(data).close()
    assert db_path(data).stat().st_mode & 0o777 == 0o600


def test_a_full_disk_defers_counts_counts_the_failure_and_recovers(tmp_path: Path) -> None:
    """SQLite's own "database or disk is full" (max_page_count caps the file as a full disk would):
    the request's counts wait in memory, the failure is counted, and the next write after space
    returns carries them, each once."""
    led = Ledger(tmp_path)
    led.record(MODEL, "k0", "", 1, 1)
    assert led._conn is not None
    pages = led._conn.execute("PRAGMA page_count").fetchone()[0]
    led._conn.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full
    n = 0
    while led.write_failures == 0:  # new rows need new pages: the first that needs one fails
        n += 1
        led.record(MODEL, f"key-{n:04d}-" + "x" * 200, "", 2, 3)
        assert n < 5000
    for _ in range(5):
        n += 1
        led.record(MODEL, f"key-{n:04d}-" + "x" * 200, "", 2, 3)
    assert led.write_failures == 6 and led.pending == 6  # nothing lost, nothing written twice
    led._conn.execute("PRAGMA max_page_count = 1073741823")  # space is back
    led.record(MODEL, "k0", "", 1, 1)
    assert led.pending == 0
    rows = led.rows()
    assert totals(rows) == (n + 2, 2 * n + 2, 3 * n + 2)
    assert all(r.requests == 1 for r in rows if r.key != "k0")
    led.close()
