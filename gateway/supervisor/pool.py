"""The one place that decides which worker serves a request, and starts it if needed.

- Two requests that need the same worker while it starts share that one start.
- Before a start, workers are evicted (least recently used idle first) until the
  new one fits `--max-loaded` and the memory budget; busy workers are never evicted,
  and when nothing can go the start waits for a worker to become idle (bounded).
- A worker that crashes 3 times in 60 s is refused for a while (503) instead of
  crash-looping.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections import deque

import psutil
import structlog
import zmq.asyncio

from gateway.errors import Conflict, Overloaded
from gateway.models.models_file import ModelsFile
from gateway.models.store import ModelEntry
from gateway.ops.metrics import Metrics
from gateway.ops.settings import Settings
from gateway.supervisor import runtime_dir
from gateway.supervisor.claims import Claims
from gateway.supervisor.compute import devices, resolve_compute
from gateway.supervisor.events import EventHub
from gateway.supervisor.eviction import Resident, plan_evictions, plan_with_device
from gateway.supervisor.handle import Happened, WorkerEvent, WorkerHandle, WorkerSpec
from gateway.supervisor.liveness import bounds_for, npu_call, verdict
from gateway.supervisor.memory import (
    embedding_kv_tokens,
    estimate_worker_bytes,
    file_bytes,
    npu_chat_bytes,
    offload_device,
    offloaded_share,
    worker_engine,
)
from gateway.supervisor.on_battery import BatteryPolicy
from gateway.supervisor.states import State
from protocol import engines, kv_cache
from protocol.keys import WorkerKey
from protocol.limits import MAX_DRAFT_MODELS
from protocol.npu_bundle import serves_shared
from protocol.npu_cache import NPU_DIR
from protocol.wire import PROMPT_CACHE_DIR, Device
from protocol.worker_args import WorkerArgs

PROGRESS_CHECK_S = 1.0  # how often workers with requests in flight are judged for progress

log = structlog.get_logger("gateway.supervisor.pool")

CAPACITY_WAIT_S = 60.0
# The share of a discrete GPU's memory the workers may plan to fill: the driver, the compute
# buffers llama.cpp sizes at load and other programs' windows take the rest.
DEVICE_SHARE = 0.9


def default_parallel(nctx: int, type_k: str = kv_cache.DEFAULT, type_v: str = kv_cache.DEFAULT) -> int:
    """Slots per worker when --parallel is not set: more for short contexts, since KV grows with both.
    (Eight slots of a small model cost about 13% of the four-client throughput on this CPU, measured
    with bench/versus.py, so four stays the ceiling; --parallel 8 serves eight clients at once.)
    The 16384 tokens are a memory budget in f16: a cache type half its size per token (q8_0) has
    twice the tokens in it, so a long context keeps more slots (and f32 fewer)."""
    f16 = 2 * kv_cache.element_bytes(kv_cache.DEFAULT)
    budget = int(16384 * f16 / (kv_cache.element_bytes(type_k) + kv_cache.element_bytes(type_v)))
    return max(1, min(4, budget // max(nctx, 1)))


class WorkerPool:
    """The only writer of the worker table: handles report what happens to them as events,
    which one task of the pool applies (core shares, crash accounting, removal, wake-ups)."""

    def __init__(self, settings: Settings, zctx: zmq.asyncio.Context, metrics: Metrics) -> None:
        self.settings = settings
        self.zctx = zctx
        self.metrics = metrics
        self.workers: dict[WorkerKey, WorkerHandle] = {}
        self.events: asyncio.Queue[WorkerEvent] = asyncio.Queue()
        self.hub = EventHub()  # state changes for /v1/events: the handles publish, clients subscribe
        self.crashed: dict[str, str] = {}  # model -> why its last worker died, until one of it is ready again
        self._starting: dict[WorkerKey, asyncio.Task[WorkerHandle]] = {}
        self.claims = Claims()  # requests handed a worker, or waiting for its start, not yet admitted
        stale = runtime_dir.sweep()
        if stale:
            log.info("removed runtime folders of gateways that are gone", paths=[str(p) for p in stale])
        self.runtime_dir = runtime_dir.create()
        self._tasks: list[asyncio.Task[None]] = []
        self._crashes: dict[WorkerKey, deque[float]] = {}
        self._backoff_until: dict[WorkerKey, float] = {}
        self._estimates: dict[WorkerKey, int] = {}  # host RAM
        self._device_estimates: dict[WorkerKey, tuple[str, int]] = {}  # a discrete GPU's own memory: (device, bytes)
        self._idle = asyncio.Condition()
        self._capacity_waiters = 0
        self._start_lock = asyncio.Lock()  # one eviction plan at a time (never held across a wait or a load)
        self._cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
        self._refusal: str | None = None  # set by abort(): the server is going, refuse every request
        # `--models-file`: a model's parallel, KV cache types (read as its worker starts) and keep_alive
        self.models_file = ModelsFile()
        self.battery = BatteryPolicy(settings.on_battery)  # `--on-battery`: what changes on battery

    def key_for(self, entry: ModelEntry, nctx: int | None, compute: str | None, ngl: int | None) -> WorkerKey:
        unit = resolve_compute(self.battery.compute(compute or self.settings.compute), worker_engine(entry))
        layers = self.settings.ngl if ngl is None else ngl
        return WorkerKey(
            model=entry.id,
            compute=unit,
            nctx=nctx or self.settings.nctx,
            ngl=layers if unit == "gpu" else 0,
        )

    async def get(self, key: WorkerKey, entry: ModelEntry, *, claim: bool = True) -> WorkerHandle:
        """The ready worker for `key`, started if need be, and claimed for one request (see
        WorkerHandle.claim) unless `claim` is false: a preload sends none."""
        self._refuse_if_aborted()
        handle = self.workers.get(key)
        if handle is not None and handle.hung is not None:
            # Being killed (gateway/supervisor/liveness.py): within a second or so it is gone, and this
            # request starts its successor rather than being refused by it.
            await handle.gone()
            if self.workers.get(key) is handle:
                del self.workers[key]  # the pool's event task counts its crash when it gets there
            handle = None
        if handle is not None and handle.state is State.READY:
            self.claims.hold(key, int(claim))
            return handle
        task = self._starting.get(key)
        if task is None:
            self._check_backoff(key)
            task = asyncio.create_task(self._start(key, entry), name=f"start:{key.slug}")
            self._starting[key] = task
            task.add_done_callback(lambda _t: self._starting.pop(key, None))
        # Claimed while waiting, so the new worker is claimed the moment it is ready, before any
        # waiting request resumes (an eviction could run in between).
        self.claims.hold(key, int(claim))
        try:
            handle = await asyncio.shield(task)
        except BaseException:
            if claim:
                self.claims.release(key)  # no worker will admit it
            raise
        self._refuse_if_aborted()  # aborted while this worker loaded
        return handle

    def abort(self, message: str) -> int:
        """The shutdown's drain ran out of time: every request still waiting on a worker, or for
        one, ends with a 503 (`message`; an error event in a stream that has begun) instead of a
        connection the server cuts, and the workers cancel their work. Never awaits. Returns how
        many requests were waiting on workers."""
        self._refusal = message
        return sum(h.abort(message) for h in list(self.workers.values()))

    def _refuse_if_aborted(self) -> None:
        if self._refusal is not None:
            raise Overloaded(self._refusal, retry_after=5)

    # ---- crash accounting ----------------------------------------------------

    def _check_backoff(self, key: WorkerKey) -> None:
        until = self._backoff_until.get(key, 0.0)
        left = until - time.monotonic()
        if left > 0:
            s = self.settings
            raise Overloaded(
                f"the worker for {key.model} crashed {s.crash_limit} times within {s.crash_window_s:g}s; "
                f"not restarting it for another {left:.0f}s (see the server log for the cause)",
                retry_after=max(1, int(left + 0.5)),
            )

    def _share_cores(self) -> None:
        """Split the cores between the CPU workers that are busy right now.

        Each llama.cpp worker spins its threads between operations; two workers with
        a thread per core each on the same cores slow each other down a hundredfold
        (measured: 30 tokens in 89 s instead of under 1 s). So busy CPU workers get
        `cores // busy` threads each, and a worker left alone gets all of them back
        (`--on-battery cap-threads`: half of them, at most, while on battery).
        """
        busy = [h for h in self.workers.values() if h.key.compute == "cpu" and h.inflight and h.state is State.READY]
        if not busy:
            return
        cap = min(self.settings.threads or self._cores, self.battery.thread_cap(self._cores) or self._cores)
        share = max(1, min(cap, self._cores // len(busy)))
        for h in busy:
            h.set_threads(share)

    async def _apply_events(self) -> None:
        while True:
            ev = await self.events.get()
            try:
                await self._apply(ev)
            except Exception:  # one bad event must not stop the pool from seeing the next (logged)
                log.exception("worker event not applied", worker=ev.handle.key.slug, event=ev.what.value)

    async def _apply(self, ev: WorkerEvent) -> None:
        if ev.what is Happened.EXITED:
            if self.workers.get(ev.handle.key) is ev.handle:
                del self.workers[ev.handle.key]
            if ev.crashed:
                self._count_crash(ev.handle.key)
                self.crashed[ev.handle.key.model] = ev.handle.exit_reason or "crashed"
        self._share_cores()
        if ev.what is not Happened.BUSY and self._capacity_waiters:
            async with self._idle:
                self._idle.notify_all()

    def _count_crash(self, key: WorkerKey) -> None:
        self.metrics.worker_crashed(key.model)
        s = self.settings
        if s.crash_limit <= 0:
            return
        now = time.monotonic()
        times = self._crashes.setdefault(key, deque(maxlen=s.crash_limit))
        times.append(now)
        if len(times) == s.crash_limit and now - times[0] <= s.crash_window_s:
            self._backoff_until[key] = now + s.crash_backoff_s
            times.clear()
            log.error("worker crash-looping; backing off", worker=key.slug, seconds=s.crash_backoff_s)

    # ---- starting, with eviction --------------------------------------------

    async def _start(self, key: WorkerKey, entry: ModelEntry) -> WorkerHandle:
        old = self.workers.pop(key, None)
        if old is not None:
            await old.stop(graceful=False, reason="replaced")
        s = self.settings
        engine = worker_engine(entry, key.compute)
        row = engines.info(engine)
        own = self.models_file.settings_of(key.model)  # the models file's, read as the worker starts
        type_k = (own.cache_type_k if own else None) or s.cache_type_k
        type_v = (own.cache_type_v if own else None) or s.cache_type_v
        kv_types = (type_k, type_v) if row.kv_types else (kv_cache.DEFAULT, kv_cache.DEFAULT)
        wanted = own.parallel if own is not None and own.parallel is not None else s.parallel
        parallel = wanted or default_parallel(key.nctx, *kv_types)
        kv_tokens = embedding_kv_tokens(entry.path) if row.batch_tokens else key.nctx * parallel
        cache_mb = s.cache_ram_mb if row.prompt_cache else 0
        model_bytes = estimate_worker_bytes(entry.path, kv_tokens, *kv_types)  # weights and KV cache
        need = model_bytes + (cache_mb << 20) + row.working_bytes
        if row.memory == "npu_graph":  # the ONNX graph, its QNN sessions and their KV buffer, not llama.cpp's
            shared = serves_shared(s.data_dir / NPU_DIR, entry.path, key.compute)
            need = npu_chat_bytes(entry.path, key.nctx, shared_weights=shared)
        if entry.mmproj and row.projector and row.memory == "gguf":  # a vision model's projector loads beside it
            need += file_bytes(entry.mmproj)
        device = offload_device(devices(engine), key.compute) if row.memory == "gguf" else None
        on_device = int(model_bytes * offloaded_share(entry.path, key.ngl)) if device else 0
        spec = WorkerSpec(
            key=key,
            worker=WorkerArgs(
                engine=engine,
                model_path=entry.path,
                compute=key.compute,
                nctx=key.nctx,
                ngl=key.ngl,
                parallel=parallel,
                threads=s.threads,
                stream_interval_ms=s.stream_interval_ms,
                nice=s.worker_nice,
                batch_tokens=row.batch_tokens,
                cache_ram_mb=cache_mb,
                cache_disk_mb=s.cache_disk_mb if row.prompt_cache else 0,
                prompt_cache_dir=str(s.data_dir / PROMPT_CACHE_DIR) if row.prompt_cache else "",
                cache_dir=str(s.data_dir / NPU_DIR) if row.npu_cache else "",
                mmproj=entry.mmproj if row.projector else "",  # llama_npu: for its CPU fallback
                npu_performance=s.npu_performance,
                npu_spinning=s.npu_spinning,
                cache_type_k=kv_types[0],
                cache_type_v=kv_types[1],
                name=key.slug,
                log_level=s.log_level or "info",
            ),
            # A first NPU load converts the GGUF and compiles its graphs: minutes for a larger model.
            load_timeout_s=max(s.load_timeout_s, row.first_load_s),
            max_queue=s.max_queue,
        )
        if row.remote:
            handle = self._admit_remote(spec, need)
        else:
            handle = await self._admit(spec, need - on_device, (device, on_device) if device and on_device else None)
        self.metrics.worker_started(key.model)
        t0 = time.perf_counter()
        try:
            # No lock is held here: other models start (and are planned around this one, which
            # counts as resident and busy) while this one loads.
            ready = await handle.start()
        except BaseException:
            if self.workers.get(key) is handle:
                self.workers.pop(key, None)
            await handle.stop(graceful=False, reason="failed to load")
            raise
        self.crashed.pop(key.model, None)
        log.info("worker ready", worker=key.slug, pid=ready.pid, seconds=round(time.perf_counter() - t0, 3),
                 parallel=ready.parallel, n_ctx=ready.n_ctx, estimate_mb=need >> 20, cpu_features=ready.cpu_features)  # fmt: skip
        return handle

    async def add_draft(self, handle: WorkerHandle, path: str) -> None:
        """A draft model the worker loads for a request, counted in its memory from then on (it
        stays loaded for the worker's life; the worker holds a few at most). Room is made for it
        as for a worker: idle workers are evicted, least recently used first; when even that
        would not do, a 503 rather than a machine out of memory."""
        if not path or path in handle.drafts or len(handle.drafts) >= MAX_DRAFT_MODELS:
            return
        w = handle.spec.worker  # its cache is the target's length, in the target's types
        need = estimate_worker_bytes(path, handle.key.nctx * w.parallel, w.cache_type_k, w.cache_type_v)
        async with self._start_lock:
            available = self._available_bytes()
            others = [r for r in self._residents() if r.slug != handle.key.slug]
            plan = plan_evictions(others, need_bytes=need, available_bytes=available, max_loaded=0)
            if plan is None:
                raise Overloaded(f"the draft model needs about {need >> 20} MiB but only {max(available, 0) >> 20} MiB "
                                 "is free, and no idle model can make room; retry later, or without it",
                                 retry_after=30)  # fmt: skip
            await self._evict(plan)
            handle.drafts.add(path)
            self._estimates[handle.key] = self._estimates.get(handle.key, 0) + need

    def _device_residents(self, device: str) -> list[Resident]:
        """The workers holding layers in `device`'s own memory, with the bytes they hold there."""
        return [
            Resident(slug=k.slug, idle=h.idle, last_used=h.last_used, bytes=self._device_estimates[k][1])
            for k, h in self.workers.items()
            if h.alive and k in self._device_estimates and self._device_estimates[k][0] == device
        ]

    def _residents(self) -> list[Resident]:
        return [
            Resident(
                slug=k.slug,
                idle=h.idle,
                last_used=h.last_used,
                bytes=self._estimates.get(k, 0),
                npu=k.compute in ("npu", "hybrid"),  # both hold the NPU
            )
            for k, h in self.workers.items()
            if h.alive and not engines.info(h.spec.engine).remote  # see _admit_remote
        ]

    def _available_bytes(self) -> int:
        """Free RAM for a new worker: what the machine has now, less the reserve, less what the
        workers still loading have yet to allocate (their whole estimate, to be safe)."""
        loading = sum(self._estimates.get(k, 0) for k, h in self.workers.items() if h.state is State.STARTING)
        return psutil.virtual_memory().available - self.settings.memory_reserve_mb * (1 << 20) - loading

    def _admit_remote(self, spec: WorkerSpec, need: int) -> WorkerHandle:
        """A worker relaying a model served elsewhere holds no weights: it is registered without an
        eviction plan, so it never stops a local model, nor counts against --max-loaded."""
        handle = WorkerHandle(spec, self.zctx, self.runtime_dir, self.events, self.claims, self.hub)
        self.workers[spec.key] = handle
        self._estimates[spec.key] = need
        return handle

    async def _admit(self, spec: WorkerSpec, need: int, on_device: tuple[Device, int] | None = None) -> WorkerHandle:
        """Evict what must go so that `spec`'s worker fits (`need`: bytes of host RAM; `on_device`:
        a discrete GPU and the bytes its layers take there), then register its handle (not yet
        started). The lock covers one eviction plan and its registration, never a wait: while
        every worker is busy, this waits for one to go idle with the lock released."""
        key = spec.key
        device, device_need = on_device if on_device else (None, 0)
        if device is not None and device_need > device.memory_total * DEVICE_SHARE:
            raise Overloaded(f"{key.model} needs about {device_need >> 20} MiB on {device.name} ({device.description}), "
                             f"which has {device.memory_total >> 20} MiB; lower ngl", retry_after=30)  # fmt: skip
        deadline = time.monotonic() + CAPACITY_WAIT_S
        waiting = False
        try:
            while True:
                async with self._start_lock:
                    available = self._available_bytes()
                    residents = self._residents()
                    on_it = self._device_residents(device.name) if device else []
                    plan = plan_with_device(
                        residents,
                        on_it,
                        need_bytes=need,
                        available_bytes=available,
                        max_loaded=self.settings.max_loaded,
                        npu=key.compute in ("npu", "hybrid"),
                        device_need=device_need,
                        device_available=int(device.memory_total * DEVICE_SHARE) - sum(r.bytes for r in on_it)
                        if device
                        else 0,
                    )
                    log.debug("eviction plan", worker=key.slug, need_mb=need >> 20, available_mb=available >> 20,
                              max_loaded=self.settings.max_loaded, evict=plan,
                              residents=[{"worker": r.slug, "idle": r.idle, "mb": r.bytes >> 20} for r in residents])  # fmt: skip
                    if plan is not None:
                        await self._evict(plan)
                        handle = WorkerHandle(spec, self.zctx, self.runtime_dir, self.events, self.claims, self.hub)
                        self.workers[key] = handle
                        self._estimates[key] = need
                        if device is not None:
                            self._device_estimates[key] = (device.name, device_need)
                        return handle
                    if not self.workers and need > available:
                        raise Overloaded(
                            f"{key.model} needs about {need >> 20} MiB but only {max(available, 0) >> 20} MiB is free "
                            f"after the {self.settings.memory_reserve_mb} MiB reserve; lower nctx or --parallel",
                            retry_after=30,
                        )
                if not waiting:
                    if self._capacity_waiters >= self.settings.max_queue:
                        raise Overloaded("every loaded worker is busy and the wait list is full; retry shortly")
                    self._capacity_waiters += 1
                    waiting = True
                    log.info("waiting for a worker to become idle", model=key.model)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Overloaded(f"no room to load {key.model}: every loaded worker stayed busy; retry shortly")
                async with self._idle:
                    try:
                        async with asyncio.timeout(min(left, 1.0)):
                            await self._idle.wait()
                    except TimeoutError:
                        pass
                self._refuse_if_aborted()
        finally:
            if waiting:
                self._capacity_waiters -= 1

    async def _evict(self, slugs: list[str]) -> None:
        for key, h in list(self.workers.items()):
            if key.slug in slugs:
                log.info("evicting worker", worker=key.slug, idle_s=round(time.monotonic() - h.last_used, 1))
                self.metrics.worker_evicted(key.model)
                self.workers.pop(key, None)
                await h.stop(reason="evicted")

    # ---- idle timeout ----------------------------------------------------------

    def start(self) -> None:
        """The pool's own tasks: applying worker events, stopping idle workers, killing hung ones."""
        self._tasks = [asyncio.create_task(self._apply_events(), name="pool-events"),
                       asyncio.create_task(self._reap_idle(), name="reaper"),
                       asyncio.create_task(self._watch_progress(), name="liveness")]  # fmt: skip
        if self.battery.policy != "none":
            self._tasks.append(asyncio.create_task(self.battery.watch(self._share_cores), name="on-battery"))

    async def _watch_progress(self) -> None:
        """Once a second, every worker with requests in flight is judged (gateway/supervisor/liveness.py);
        a hung one is killed, its requests fail naming it, and the next request starts a new one."""
        s = self.settings
        while True:
            await asyncio.sleep(PROGRESS_CHECK_S)
            now = time.monotonic()
            for h in list(self.workers.values()):
                if h.state is not State.READY or not h.inflight or h.hung is not None:
                    continue
                why = verdict(now, h.last_heard, h.beat.step_s, h.beat_at,
                              bounds_for(h.spec.engine, s.hang_silence_s, s.hang_step_s),
                              npu=npu_call(h.ready_info))  # fmt: skip
                if why is not None:
                    self.metrics.worker_hung(h.key.model)
                    h.kill_hung(why)

    def residents_of(self, model: str) -> list[WorkerHandle]:
        return [h for k, h in self.workers.items() if k.model == model and h.alive]

    def memory_of(self, h: WorkerHandle) -> tuple[int, int]:
        """(bytes of host RAM, bytes of a discrete GPU's memory) the pool planned for the worker."""
        device = self._device_estimates.get(h.key)
        return self._estimates.get(h.key, 0), device[1] if device is not None else 0

    def loading(self, model: str) -> bool:
        """Whether a worker of `model` is being started (its memory planned, or its process loading)."""
        return any(k.model == model for k in self._starting)

    def backing_off(self, model: str) -> bool:
        """Whether a worker of `model` crashed so often that it is refused for now."""
        now = time.monotonic()
        return any(k.model == model and until > now for k, until in self._backoff_until.items())

    async def unload(self, model: str, compute: str | None = None, nctx: int | None = None) -> list[WorkerHandle]:
        """Stop the model's workers (those on `compute`/`nctx` when given). Refused, stopping none,
        while any of them has requests running or queued: an unload never cuts an answer short."""
        chosen = [h for h in self.residents_of(model)
                  if (compute is None or h.key.compute == compute) and (nctx is None or h.key.nctx == nctx)]  # fmt: skip
        busy = [h for h in chosen if h.state is State.STARTING or (h.state is State.READY and not h.idle)]
        if busy:
            raise Conflict(f"{model} is serving {sum(h.inflight for h in busy)} request(s) or still loading; "
                           "unload it once they finish", retry_after=5)  # fmt: skip
        for h in chosen:
            log.info("unloading worker", worker=h.key.slug)
            self.metrics.worker_unloaded(model)
            if self.workers.get(h.key) is h:
                self.workers.pop(h.key)
            await h.stop(reason="unload")
        return chosen

    def keep_alive_of(self, h: WorkerHandle) -> float:
        """A request's `keep_alive`, else the models file's for the model, else `--keep-alive-s`."""
        if h.keep_alive is not None:
            return h.keep_alive
        own = self.models_file.settings_of(h.key.model)
        return own.keep_alive if own is not None and own.keep_alive is not None else self.settings.keep_alive_s

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for key, h in list(self.workers.items()):
                keep_alive = self.keep_alive_of(h)
                if keep_alive >= 0 and h.idle and now - h.last_used >= keep_alive:
                    log.info("worker idle; stopping", worker=key.slug, idle_s=round(now - h.last_used, 1))
                    self.workers.pop(key, None)
                    await h.stop(reason="idle")

    async def close(self, drain_timeout: float = 0.0) -> None:
        for task in self._tasks:
            task.cancel()
        for start in list(self._starting.values()):
            start.cancel()
        handles = list(self.workers.values())
        self.workers.clear()
        await asyncio.gather(*(h.stop(graceful=drain_timeout > 0, timeout=drain_timeout, reason="shutdown")
                               for h in handles),
                             return_exceptions=True)  # fmt: skip
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
