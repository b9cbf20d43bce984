"""The replies of an engine whose work runs on a thread of its own (Genie's blocking query, an
upstream's event loop): that thread queues them, and the worker's loop takes them in `step`.

A request is active from its submit until its final reply or its Cancel; the replies of one that
is no longer active (a cancelled request's late pieces) are dropped, since its Done went out with
the Cancel. Each engine keeps its own note per active request (Genie's job, nothing upstream).
"""

from __future__ import annotations

import queue
from typing import Generic, TypeVar

from protocol.wire import Delta, Done, Embeddings, Failed, FromWorker, Scores, TokenCount
from workers.engines import Emit

STEP_WAIT_S = 0.005  # how long `step` waits for a reply: the worker then checks for Cancels and new requests
FINAL = (Done, Failed, TokenCount, Embeddings, Scores)  # a request's last reply

T = TypeVar("T")


class ThreadReplies(Generic[T]):
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[FromWorker] = queue.SimpleQueue()
        self.active: dict[int, T] = {}  # unfinished requests, as the worker's thread sees them

    def put(self, msg: FromWorker) -> None:
        """Queue a reply (any thread)."""
        self._queue.put(msg)

    def pending(self) -> bool:
        """Something to wait for or to emit: the engine's `has_work`."""
        return bool(self.active) or not self._queue.empty()

    def drain(self, emit: Emit, wait: bool) -> None:
        """Emit what is queued, the active requests' only, after waiting up to STEP_WAIT_S for a
        first reply where `wait` (work is under way); a request's final reply ends it."""
        try:
            first = self._queue.get(timeout=STEP_WAIT_S if wait else 0)
        except queue.Empty:
            return
        msgs = [first]
        while True:
            try:
                msgs.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for msg in coalesce(msgs):
            rid = getattr(msg, "req_id", None)
            if rid is None or rid in self.active:
                emit(msg)
                if isinstance(msg, FINAL):
                    self.active.pop(rid, None)  # type: ignore[arg-type]


def coalesce(msgs: list[FromWorker]) -> list[FromWorker]:
    """Runs of plain Deltas of one request, queued while the worker's thread was busy, as one Delta:
    when the relay falls behind (many streams, a loaded machine) it sends fewer, larger messages,
    and a relay that keeps up sends each piece as it comes."""
    out: list[FromWorker] = []
    for msg in msgs:
        last = out[-1] if out else None
        if type(msg) is Delta and type(last) is Delta and last.req_id == msg.req_id:
            out[-1] = Delta(msg.req_id, last.text + msg.text, msg.n_tokens)
        else:
            out.append(msg)
    return out
