"""Stored responses and conversations: one SQLite file in the data dir, `responses.sqlite3`.

A response made with `store: true` is kept with what a continuation and the lists need: the
response itself, its own input items (`GET .../input_items`), its whole conversation as chat
messages (so that `previous_response_id` needs no chain of rows that eviction could break) and,
for a background response, its stream events (replayed by `GET ...?stream=true`). Conversations
keep their items in order.

Everything belongs to the caller that made it (the API key's label; one owner for all on a server
without keys): every read, list, continuation and deletion is by (owner, id), so another key's id
is as absent as one that never existed. Bounds are per owner, so one key's flood evicts only its
own: a count and bytes for responses (the oldest finished one goes first; a queued or running
one never), and for conversations (the one least recently added to goes first). Each eviction is
logged, and the request whose write caused it is told (gateway/dialects/responses/routes.py).

SQLite runs in WAL mode with `synchronous=NORMAL` (a commit writes the log without waiting for the
disk; a power cut may lose the last commits, never corrupt the file). All of it runs on one thread
of its own, never on the event loop (a checkpoint does wait for the disk), and in the order it
was asked for: a read asked for after a write sees it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import structlog

from gateway.dialects.responses.translate import new_id
from gateway.errors import BadRequest
from protocol import chat
from protocol import responses as r
from protocol.conversations import Conversation, ItemList

log = structlog.get_logger("gateway.responses")

T = TypeVar("T")

FILE = "responses.sqlite3"
UNFINISHED = ("queued", "in_progress")
STOPPED = "the server stopped before it finished"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    n INTEGER PRIMARY KEY AUTOINCREMENT,  -- the order they were stored in: the oldest go first
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    status TEXT NOT NULL,
    response BLOB NOT NULL,               -- the Response, JSON
    input_items BLOB NOT NULL,            -- its own input items as listed, JSON
    conversation BLOB NOT NULL,           -- its conversation as chat messages, JSON
    events BLOB,                          -- a background response's stream events, msgpack [[type, seq, json]]
    size INTEGER NOT NULL,
    UNIQUE (owner, id)
);
CREATE INDEX IF NOT EXISTS responses_owner ON responses (owner, n);
CREATE TABLE IF NOT EXISTS conversations (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    metadata BLOB NOT NULL,
    touched REAL NOT NULL,                -- when items were last added: the least recent go first
    UNIQUE (owner, id)
);
CREATE INDEX IF NOT EXISTS conversations_owner ON conversations (owner, touched);
CREATE TABLE IF NOT EXISTS conversation_items (
    n INTEGER PRIMARY KEY AUTOINCREMENT,  -- the items' order
    conversation INTEGER NOT NULL REFERENCES conversations (n) ON DELETE CASCADE,
    id TEXT NOT NULL,
    item BLOB NOT NULL,                   -- JSON, as listed
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS conversation_items_of ON conversation_items (conversation, n);
CREATE INDEX IF NOT EXISTS conversation_items_id ON conversation_items (conversation, id);
"""

_messages = msgspec.json.Decoder(list[chat.ChatMessage])
_response = msgspec.json.Decoder(r.Response)
_items = msgspec.json.Decoder(list[dict[str, Any]])
_events = msgspec.msgpack.Decoder(list[tuple[str, int, bytes]])
_metadata = msgspec.json.Decoder(dict[str, str])


async def settled(work: concurrent.futures.Future[T]) -> T:
    """The store's answer. A caller cancelled while waiting (a client gone) must not cancel a write
    that has not started yet: wrap_future would, so it is shielded."""
    return await asyncio.shield(asyncio.wrap_future(work))


@dataclass(frozen=True, slots=True)
class Limits:
    """Per owner (an API key's label)."""

    responses: int = 1000
    response_bytes: int = 256 << 20
    conversations: int = 1000
    conversation_bytes: int = 256 << 20


@dataclass(frozen=True, slots=True)
class Stored:
    response: r.Response
    conversation: list[chat.ChatMessage]  # input and output, without instructions: what a continuation reads
    input_items: list[dict[str, Any]]
    replayable: bool  # it kept its stream events


class ResponseStore:
    def __init__(self, path: Path | None, limits: Limits | None = None) -> None:
        """`path`: the SQLite file (None: in memory, for tests)."""
        self.path = path
        self.limits = limits or Limits()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="responses-store")
        self._db: sqlite3.Connection | None = None

    # ---- the thread ----------------------------------------------------------------

    def _submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        return self._thread.submit(fn, *args)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await settled(self._submit(fn, *args))

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            self._open()
        assert self._db is not None
        return self._db

    def _open(self) -> None:
        where = ":memory:"
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            where = str(self.path)
        db = sqlite3.connect(where, isolation_level=None, check_same_thread=False)  # used on one thread only
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        db.executescript(_SCHEMA)
        self._db = db

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction (the connection is in autocommit mode otherwise)."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    async def open(self) -> list[str]:
        """Open the file; responses a stopped server left queued or running are marked failed,
        saying so. Their ids."""
        return await self._run(self._mark_unfinished)

    def _mark_unfinished(self) -> list[str]:
        db = self.db
        rows = db.execute(f"SELECT n, id, response FROM responses WHERE status IN {UNFINISHED}").fetchall()
        with self._tx():
            for n, _, blob in rows:
                response = msgspec.structs.replace(_response.decode(blob), status="failed",
                                                   error=r.ResponseError("server_error", STOPPED))  # fmt: skip
                db.execute("UPDATE responses SET status = 'failed', response = ? WHERE n = ?",
                           (msgspec.json.encode(response), n))  # fmt: skip
        ids = [row[1] for row in rows]
        if ids:
            log.warning("stored responses left unfinished by a stopped server marked failed", responses=ids)
        return ids

    async def close(self) -> None:
        def close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await self._run(close)
        self._thread.shutdown(wait=True)

    # ---- responses -------------------------------------------------------------------

    def put_soon(self, owner: str, response: r.Response, input_items: list[dict[str, Any]],
                 conversation: list[chat.ChatMessage],
                 events: list[tuple[str, int, bytes]] | None = None) -> concurrent.futures.Future[list[str]]:  # fmt: skip
        """Keep (or replace) a response; the future's result: the ids this evicted. Asked for at
        once, so that a read asked for later sees it, without waiting here."""
        blobs = (msgspec.json.encode(response), msgspec.json.encode(input_items), msgspec.json.encode(conversation),
                 msgspec.msgpack.encode(events) if events is not None else None)  # fmt: skip
        return self._submit(self._put, owner, response.id, response.status, blobs)

    async def put(self, owner: str, response: r.Response, input_items: list[dict[str, Any]],
                  conversation: list[chat.ChatMessage], events: list[tuple[str, int, bytes]] | None = None) -> list[str]:  # fmt: skip
        return await settled(self.put_soon(owner, response, input_items, conversation, events))

    def _put(self, owner: str, response_id: str, status: str,
             blobs: tuple[bytes, bytes, bytes, bytes | None]) -> list[str]:  # fmt: skip
        size = sum(len(b) for b in blobs if b is not None)
        if size > self.limits.response_bytes:
            log.warning("response not stored: larger than a key's whole store (--responses-store-mb)",
                        response=response_id, bytes=size)  # fmt: skip
            return []
        db = self.db
        with self._tx():
            db.execute(
                "INSERT INTO responses (owner, id, status, response, input_items, conversation, events, size) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner, id) DO UPDATE SET status = excluded.status, "
                "response = excluded.response, input_items = excluded.input_items, "
                "conversation = excluded.conversation, events = excluded.events, size = excluded.size",
                (owner, response_id, status, *blobs, size),
            )
            return self._evict_responses(owner, keep=response_id)

    def _evict_responses(self, owner: str, keep: str) -> list[str]:
        db, lim = self.db, self.limits
        count, size = db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses WHERE owner = ?",
                                 (owner,)).fetchone()  # fmt: skip
        evicted: list[str] = []
        while count > lim.responses or size > lim.response_bytes:
            row = db.execute(f"SELECT n, id, size FROM responses WHERE owner = ? AND id != ? AND status NOT IN "
                             f"{UNFINISHED} ORDER BY n LIMIT 1", (owner, keep)).fetchone()  # fmt: skip
            if row is None:
                break
            why = "count" if count > lim.responses else "bytes"
            db.execute("DELETE FROM responses WHERE n = ?", (row[0],))
            count, size = count - 1, size - row[2]
            evicted.append(row[1])
            log.info("stored response evicted, the owner's oldest", response=row[1], owner=owner or "-",
                     bound="--responses-store-max" if why == "count" else "--responses-store-mb")  # fmt: skip
        return evicted

    async def get(self, owner: str, response_id: str) -> Stored | None:
        return await self._run(self._get, owner, response_id)

    def _get(self, owner: str, response_id: str) -> Stored | None:
        row = self.db.execute("SELECT response, conversation, input_items, events IS NOT NULL FROM responses "
                              "WHERE owner = ? AND id = ?", (owner, response_id)).fetchone()  # fmt: skip
        if row is None:
            return None
        return Stored(_response.decode(row[0]), _messages.decode(row[1]), _items.decode(row[2]), bool(row[3]))

    async def events(self, owner: str, response_id: str) -> list[tuple[str, int, bytes]] | None:
        def events() -> list[tuple[str, int, bytes]] | None:
            row = self.db.execute("SELECT events FROM responses WHERE owner = ? AND id = ?",
                                  (owner, response_id)).fetchone()  # fmt: skip
            return None if row is None or row[0] is None else _events.decode(row[0])

        return await self._run(events)

    async def delete(self, owner: str, response_id: str) -> bool:
        def delete() -> bool:
            with self._tx() as db:
                return db.execute("DELETE FROM responses WHERE owner = ? AND id = ?", (owner, response_id)).rowcount > 0

        return await self._run(delete)

    async def stats(self) -> tuple[int, int]:
        """(responses kept, their bytes), all owners together."""
        return await self._run(lambda: tuple(self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses").fetchone()))  # fmt: skip

    # ---- conversations -------------------------------------------------------------

    async def create_conversation(self, owner: str, metadata: dict[str, str],
                                  items: list[dict[str, Any]]) -> tuple[Conversation, list[str]]:  # fmt: skip
        """The new conversation, and the ids of the conversations its creation evicted."""
        return await self._run(self._create_conversation, owner, metadata, items)

    def _create_conversation(self, owner: str, metadata: dict[str, str],
                             items: list[dict[str, Any]]) -> tuple[Conversation, list[str]]:  # fmt: skip
        conv = Conversation(id=new_id("conv"), created_at=int(time.time()), metadata=metadata)
        with self._tx() as db:
            n = db.execute("INSERT INTO conversations (owner, id, created_at, metadata, touched) VALUES (?, ?, ?, ?, ?)",
                           (owner, conv.id, conv.created_at, msgspec.json.encode(metadata), time.time())).lastrowid  # fmt: skip
            assert n is not None
            evicted = self._append(owner, n, items, "items")
        return conv, evicted

    def _row(self, owner: str, conversation_id: str) -> tuple[int, Conversation] | None:
        row = self.db.execute("SELECT n, created_at, metadata FROM conversations WHERE owner = ? AND id = ?",
                              (owner, conversation_id)).fetchone()  # fmt: skip
        if row is None:
            return None
        return row[0], Conversation(id=conversation_id, created_at=row[1], metadata=_metadata.decode(row[2]))

    async def conversation(self, owner: str, conversation_id: str) -> Conversation | None:
        found = await self._run(self._row, owner, conversation_id)
        return None if found is None else found[1]

    async def update_conversation(self, owner: str, conversation_id: str,
                                  metadata: dict[str, str]) -> Conversation | None:  # fmt: skip
        def update() -> Conversation | None:
            with self._tx() as db:
                db.execute("UPDATE conversations SET metadata = ? WHERE owner = ? AND id = ?",
                           (msgspec.json.encode(metadata), owner, conversation_id))  # fmt: skip
            found = self._row(owner, conversation_id)
            return None if found is None else found[1]

        return await self._run(update)

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        def delete() -> bool:
            with self._tx() as db:
                return db.execute("DELETE FROM conversations WHERE owner = ? AND id = ?",
                                  (owner, conversation_id)).rowcount > 0  # fmt: skip

        return await self._run(delete)

    def add_items_soon(self, owner: str, conversation_id: str, items: list[dict[str, Any]],
                       field: str = "items") -> concurrent.futures.Future[list[str] | None]:  # fmt: skip
        """Append items; the future's result: the conversations this evicted, or None: no such
        conversation (a BadRequest: past the conversation's bound)."""

        def add() -> list[str] | None:
            found = self._row(owner, conversation_id)
            if found is None:
                return None
            with self._tx():
                return self._append(owner, found[0], items, field)

        return self._submit(add)

    async def add_items(self, owner: str, conversation_id: str, items: list[dict[str, Any]],
                        field: str = "items") -> list[str] | None:  # fmt: skip
        return await settled(self.add_items_soon(owner, conversation_id, items, field))

    def _append(self, owner: str, n: int, items: list[dict[str, Any]], field: str) -> list[str]:
        db, lim = self.db, self.limits
        blobs = [msgspec.json.encode(item) for item in items]
        (own,) = db.execute("SELECT COALESCE(SUM(size), 0) FROM conversation_items WHERE conversation = ?",
                            (n,)).fetchone()  # fmt: skip
        if own + sum(map(len, blobs)) > lim.conversation_bytes:
            raise BadRequest(f"`{field}`: the conversation would hold more than its bound of "
                             f"{lim.conversation_bytes >> 20} MiB (--conversations-store-mb)")  # fmt: skip
        db.executemany("INSERT INTO conversation_items (conversation, id, item, size) VALUES (?, ?, ?, ?)",
                       [(n, item["id"], blob, len(blob)) for item, blob in zip(items, blobs, strict=True)])  # fmt: skip
        db.execute("UPDATE conversations SET touched = ? WHERE n = ?", (time.time(), n))
        return self._evict_conversations(owner, keep=n)

    def _evict_conversations(self, owner: str, keep: int) -> list[str]:
        db, lim = self.db, self.limits
        (count,) = db.execute("SELECT COUNT(*) FROM conversations WHERE owner = ?", (owner,)).fetchone()
        (size,) = db.execute("SELECT COALESCE(SUM(i.size), 0) FROM conversation_items i JOIN conversations c "
                             "ON i.conversation = c.n WHERE c.owner = ?", (owner,)).fetchone()  # fmt: skip
        evicted: list[str] = []
        while count > lim.conversations or size > lim.conversation_bytes:
            row = db.execute("SELECT n, id FROM conversations WHERE owner = ? AND n != ? ORDER BY touched LIMIT 1",
                             (owner, keep)).fetchone()  # fmt: skip
            if row is None:
                break
            (freed,) = db.execute("SELECT COALESCE(SUM(size), 0) FROM conversation_items WHERE conversation = ?",
                                  (row[0],)).fetchone()  # fmt: skip
            why = "--conversations-store-max" if count > lim.conversations else "--conversations-store-mb"
            db.execute("DELETE FROM conversations WHERE n = ?", (row[0],))
            count, size = count - 1, size - freed
            evicted.append(row[1])
            log.info("conversation evicted, the owner's least recently used", conversation=row[1], owner=owner or "-",
                     bound=why)  # fmt: skip
        return evicted

    async def items(self, owner: str, conversation_id: str) -> list[dict[str, Any]] | None:
        """Every item, in order (a response's history); None: no such conversation."""

        def items() -> list[dict[str, Any]] | None:
            found = self._row(owner, conversation_id)
            if found is None:
                return None
            rows = self.db.execute("SELECT item FROM conversation_items WHERE conversation = ? ORDER BY n",
                                   (found[0],)).fetchall()  # fmt: skip
            return [msgspec.json.decode(row[0]) for row in rows]

        return await self._run(items)

    async def list_items(self, owner: str, conversation_id: str, after: str | None, limit: int,
                         ascending: bool) -> ItemList | None:  # fmt: skip
        def page() -> ItemList | None:
            found = self._row(owner, conversation_id)
            if found is None:
                return None
            n, db = found[0], self.db
            op, order = (">", "ASC") if ascending else ("<", "DESC")
            bound = ""
            args: tuple[Any, ...] = (n,)
            if after:
                at = db.execute("SELECT n FROM conversation_items WHERE conversation = ? AND id = ?",
                                (n, after)).fetchone()  # fmt: skip
                if at is None:
                    raise BadRequest(f"`after`: no item {after[:128]!r} in this conversation")
                bound, args = f" AND n {op} ?", (n, at[0])
            rows = db.execute(f"SELECT item FROM conversation_items WHERE conversation = ?{bound} ORDER BY n {order} "
                              "LIMIT ?", (*args, limit + 1)).fetchall()  # fmt: skip
            data = [msgspec.json.decode(row[0]) for row in rows[:limit]]
            return ItemList(data=data, first_id=data[0]["id"] if data else None,
                            last_id=data[-1]["id"] if data else None, has_more=len(rows) > limit)  # fmt: skip

        return await self._run(page)

    async def item(self, owner: str, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        def item() -> dict[str, Any] | None:
            found = self._row(owner, conversation_id)
            if found is None:
                return None
            row = self.db.execute("SELECT item FROM conversation_items WHERE conversation = ? AND id = ?",
                                  (found[0], item_id)).fetchone()  # fmt: skip
            return None if row is None else msgspec.json.decode(row[0])

        return await self._run(item)

    async def delete_item(self, owner: str, conversation_id: str, item_id: str) -> Conversation | None:
        """The conversation, once its item is gone; None: no such conversation or item."""

        def delete() -> Conversation | None:
            found = self._row(owner, conversation_id)
            if found is None:
                return None
            with self._tx() as db:
                gone = db.execute("DELETE FROM conversation_items WHERE conversation = ? AND id = ?",
                                  (found[0], item_id)).rowcount  # fmt: skip
            return found[1] if gone else None

        return await self._run(delete)
