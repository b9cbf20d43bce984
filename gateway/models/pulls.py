"""Downloads running in the server (`POST /v1/models/pull`, `POST /api/pull`).

Every client that pulls the same model (the same `pull_key`) follows ONE download: the first
starts it, later ones join and are shown everything it reported so far, then its progress as it
comes. The download is `gateway.models.pull.pull` in a thread of its own (never the event loop's,
never the default executor's, which a long download would hold for its whole length); the thread
hands its steps to the loop with `call_soon_threadsafe`, and the loop owns all state here.

A step that changes phase, and a file's first and last byte counts, reach every follower; byte
counts in between are coalesced, at most one per `tick_s` per follower, so a fast disk or a slow
client never floods the stream. When the last follower leaves (its client disconnected), the
download is cancelled: pull() stops within a read and removes its staging folder, so the store
lists nothing of it.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Callable

import structlog

from gateway.errors import GenieXError, Overloaded
from gateway.models.pull_names import pull_key
from gateway.models.store import ModelEntry, ModelStore
from protocol.pull import PullProgress

log = structlog.get_logger("gateway.pulls")

ProgressFn = Callable[[PullProgress], None]
# (store, name, on_progress, cancel) -> the pulled entry; raises GenieXError
DownloadFn = Callable[[ModelStore, str, ProgressFn, threading.Event], ModelEntry]

TICK_S = 0.1  # at most ~10 byte counts a second per follower
THREAD_TICK_S = 0.05  # the download thread wakes the loop at most 20 times a second for byte counts
KEEPALIVE_S = 15.0  # a follower hears something at least this often (a long digest check says nothing)
JOIN_S = 3.0  # at shutdown, how long to wait for cancelled downloads to clean up their staging


def _pull_from_hub(store: ModelStore, name: str, on_progress: ProgressFn, cancel: threading.Event) -> ModelEntry:
    from gateway.models import pull  # huggingface_hub is slow to import: not at server start

    pull.finer_chunks()
    return pull.pull(store, name, progress=False, on_progress=on_progress, cancel=cancel)


def _call(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: the server is gone, nobody is following
        pass


class Download:
    """One running pull and every step it reported; touched only on the event loop."""

    def __init__(self, key: str, name: str) -> None:
        self.key = key
        self.name = name
        self.cancel = threading.Event()
        self.why_cancelled: str | None = None  # a message for whoever is still following, if anyone
        self.steps: list[tuple[int, PullProgress]] = []  # (seq, step): the steps no follower may miss
        self.latest: tuple[int, PullProgress] | None = None  # the newest byte count
        self.entry: ModelEntry | None = None
        self.error: GenieXError | None = None
        self.done = False
        self.followers = 0
        self.thread: threading.Thread | None = None
        self._seq = 0
        self._wakers: set[asyncio.Event] = set()

    def record(self, step: PullProgress) -> None:
        self._seq += 1
        if step.final:
            if not self.steps or self.steps[-1][1] != step:
                self.steps.append((self._seq, step))
        else:
            self.latest = (self._seq, step)
        self._wake()

    def finish(self, entry: ModelEntry | None, error: GenieXError | None) -> None:
        self.entry, self.error, self.done = entry, error, True
        self._wake()

    def _wake(self) -> None:
        for waker in self._wakers:
            waker.set()


class Follower:
    """One client's view of a download: `progress()`, then `result()`; `leave()` when it goes."""

    def __init__(self, pulls: Pulls, download: Download) -> None:
        self.pulls = pulls
        self.download = download
        self.left = False

    async def progress(self, keepalive_s: float = KEEPALIVE_S) -> AsyncIterator[PullProgress | None]:
        """The download's steps from its start, byte counts at most every `tick_s`; None after
        `keepalive_s` without news (for a keep-alive). Ends when the download does."""
        d, tick_s = self.download, self.pulls.tick_s
        loop = asyncio.get_running_loop()
        waker = asyncio.Event()
        d._wakers.add(waker)
        sent, seen, last_tick, last_news = 0, 0, -math.inf, loop.time()
        try:
            while True:
                waker.clear()  # before looking: a step recorded after this sets it again
                while sent < len(d.steps):
                    seen, step = d.steps[sent]
                    sent += 1
                    last_news = loop.time()
                    yield step
                timeout = keepalive_s - (loop.time() - last_news)
                if d.latest is not None and d.latest[0] > seen:
                    wait = last_tick + tick_s - loop.time()
                    if wait <= 0:
                        seen, step = d.latest
                        last_tick = last_news = loop.time()
                        yield step
                        continue
                    timeout = min(timeout, wait)
                if d.done:
                    return
                if timeout <= 0:
                    last_news = loop.time()
                    yield None
                    continue
                try:
                    async with asyncio.timeout(timeout):
                        await waker.wait()
                except TimeoutError:
                    pass
        finally:
            d._wakers.discard(waker)

    def result(self) -> ModelEntry:
        """The pulled model, once `progress()` has ended; raises the download's error."""
        d = self.download
        if d.error is not None:
            raise d.error
        if d.entry is None:
            raise GenieXError(f"the pull of {d.name} ended without a model")
        return d.entry

    async def wait(self) -> ModelEntry:
        """The pulled model (for a client that wants no progress); leaves when done or cancelled."""
        try:
            async for _ in self.progress():
                pass
            return self.result()
        finally:
            self.leave()

    def leave(self) -> None:
        """This client is gone; the last one to go cancels a download still running."""
        if self.left:
            return
        self.left = True
        d = self.download
        d.followers -= 1
        if d.followers <= 0 and not d.done:
            log.info("every client following the pull left; cancelling it", model=d.name)
            d.cancel.set()
            self.pulls.forget(d)


class Pulls:
    """The server's running downloads, shared by every client that asks for the same model."""

    def __init__(self, download: DownloadFn | None = None, tick_s: float = TICK_S) -> None:
        self._download = download or _pull_from_hub
        self.tick_s = tick_s
        self.running: dict[str, Download] = {}

    def follow(self, store: ModelStore, name: str) -> Follower:
        """Join the download of `name` (`org/repo[:precision]`), starting it if none runs; call on the loop."""
        key = pull_key(name)
        d = self.running.get(key)
        if d is None:
            d = self.running[key] = Download(key, name)
            self._start(d, store)
        d.followers += 1
        return Follower(self, d)

    def forget(self, d: Download) -> None:
        """`d` takes no new followers: a pull of the same model from now on starts afresh."""
        if self.running.get(d.key) is d:
            del self.running[d.key]

    def _start(self, d: Download, store: ModelStore) -> None:
        loop = asyncio.get_running_loop()
        last = -math.inf

        def on_progress(step: PullProgress) -> None:  # in the download's thread
            nonlocal last
            if not step.final:
                now = time.monotonic()
                if now - last < THREAD_TICK_S:
                    return
                last = now
            _call(loop, d.record, step)

        def run() -> None:
            entry, error = None, None
            try:
                entry = self._download(store, d.name, on_progress, d.cancel)
            except GenieXError as exc:
                error = exc
            except Exception:  # the thread's end is reported, never lost
                log.exception("pull failed", model=d.name)
                error = GenieXError(f"the pull of {d.name} failed; the server log has the details")
            _call(loop, self._finished, d, entry, error)

        log.info("pull started", model=d.name)
        d.thread = threading.Thread(target=run, name=f"pull {d.key}", daemon=True)
        d.thread.start()

    def _finished(self, d: Download, entry: ModelEntry | None, error: GenieXError | None) -> None:
        if error is not None and d.cancel.is_set() and d.why_cancelled:
            error = Overloaded(d.why_cancelled, retry_after=5)
        if error is None:
            log.info("pull done", model=d.name, id=entry.id if entry else None)
        elif d.cancel.is_set():
            log.info("pull cancelled; nothing of it was kept", model=d.name)
        else:
            log.warning("pull failed", model=d.name, status=error.status, error=error.message)
        d.finish(entry, error)
        self.forget(d)

    def cancel_all(self, why: str = "the server is shutting down; pull again when it is back") -> None:
        """Stop every running download (the server is shutting down), and give them a moment to
        remove what they staged."""
        downloads = list(self.running.values())
        for d in downloads:
            d.why_cancelled = why
            d.cancel.set()
            self.forget(d)
        deadline = time.monotonic() + JOIN_S
        for d in downloads:
            if d.thread is not None:
                d.thread.join(max(0.0, deadline - time.monotonic()))
        if downloads:
            log.info("running pulls cancelled", models=[d.name for d in downloads])
