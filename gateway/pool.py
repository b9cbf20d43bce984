"""The one place that decides which worker serves a request, and starts it if needed.

Two requests that need the same worker while it starts share that one start.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import structlog
import zmq.asyncio

from gateway.compute import resolve_compute
from gateway.config import Settings
from gateway.store import ModelEntry
from gateway.worker_handle import WorkerHandle, WorkerSpec
from gateway.worker_state import State
from protocol.keys import WorkerKey

log = structlog.get_logger("gateway.pool")


def default_parallel(nctx: int) -> int:
    """Slots per worker when --parallel is not set: more for short contexts, since KV grows with both."""
    return max(1, min(4, 16384 // max(nctx, 1)))


class WorkerPool:
    def __init__(self, settings: Settings, zctx: zmq.asyncio.Context) -> None:
        self.settings = settings
        self.zctx = zctx
        self.workers: dict[WorkerKey, WorkerHandle] = {}
        self._starting: dict[WorkerKey, asyncio.Task[WorkerHandle]] = {}
        # ipc paths must stay under ~100 bytes, so not under the data dir; mkdtemp is 0700.
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="geniex-", dir=os.environ.get("XDG_RUNTIME_DIR")))
        self._reaper: asyncio.Task[None] | None = None

    def key_for(self, entry: ModelEntry, nctx: int | None, compute: str | None, ngl: int | None) -> WorkerKey:
        unit = resolve_compute(compute or self.settings.compute, entry.engine)
        layers = self.settings.ngl if ngl is None else ngl
        return WorkerKey(
            model=entry.id,
            compute=unit,
            nctx=nctx or self.settings.nctx,
            ngl=layers if unit == "gpu" else 0,
        )

    async def get(self, key: WorkerKey, entry: ModelEntry) -> WorkerHandle:
        handle = self.workers.get(key)
        if handle is not None and handle.state is State.READY:
            return handle
        task = self._starting.get(key)
        if task is None:
            task = asyncio.create_task(self._start(key, entry), name=f"start:{key.slug}")
            self._starting[key] = task
            task.add_done_callback(lambda _t: self._starting.pop(key, None))
        return await asyncio.shield(task)

    async def _start(self, key: WorkerKey, entry: ModelEntry) -> WorkerHandle:
        old = self.workers.pop(key, None)
        if old is not None:
            await old.stop(graceful=False)
        s = self.settings
        spec = WorkerSpec(
            key=key,
            model_path=entry.path,
            engine=entry.engine,
            ngl=key.ngl,
            parallel=s.parallel or default_parallel(key.nctx),
            threads=s.threads,
            log_level=s.log_level or "info",
            load_timeout=s.load_timeout,
            max_queue=s.max_queue,
        )
        handle = WorkerHandle(spec, self.zctx, self.runtime_dir)
        self.workers[key] = handle
        t0 = time.perf_counter()
        try:
            ready = await handle.start()
        except BaseException:
            self.workers.pop(key, None)
            await handle.stop(graceful=False)
            raise
        log.info("worker ready", worker=key.slug, pid=ready.pid, seconds=round(time.perf_counter() - t0, 3),
                 parallel=ready.parallel, n_ctx=ready.n_ctx)  # fmt: skip
        return handle

    # ---- idle timeout ------------------------------------------------------

    def start_reaper(self) -> None:
        self._reaper = asyncio.create_task(self._reap_idle(), name="reaper")

    async def _reap_idle(self) -> None:
        keepalive = self.settings.keepalive
        if keepalive < 0:
            return
        while True:
            await asyncio.sleep(min(max(keepalive / 4, 0.05), 5.0))
            now = time.monotonic()
            for key, h in list(self.workers.items()):
                if h.state is State.READY and h.inflight == 0 and now - h.last_used >= keepalive:
                    log.info("worker idle; stopping", worker=key.slug, idle_s=round(now - h.last_used, 1))
                    self.workers.pop(key, None)
                    await h.stop()
                elif h.state in (State.FAILED, State.STOPPED):
                    self.workers.pop(key, None)

    async def close(self, drain_timeout: float = 0.0) -> None:
        if self._reaper:
            self._reaper.cancel()
        for t in list(self._starting.values()):
            t.cancel()
        handles = list(self.workers.values())
        self.workers.clear()
        await asyncio.gather(*(h.stop(graceful=drain_timeout > 0, timeout=drain_timeout) for h in handles),
                             return_exceptions=True)  # fmt: skip
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
