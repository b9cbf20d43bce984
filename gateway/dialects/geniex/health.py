"""Liveness, readiness, and the worker table: none of them waits behind inference."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Response, get
from litestar.di import NamedDependency

from gateway.http.lifecycle import Lifecycle
from gateway.http.services import Services
from gateway.supervisor.on_battery import PowerInfo
from protocol.doctor import fallback_check
from protocol.wire import Device, UpstreamHealth


class UpstreamInfo(msgspec.Struct):
    """An upstream worker's last probe of the server its model lives on."""

    url: str
    healthy: bool
    detail: str
    latency_ms: float
    checked_s_ago: float


class WorkerInfo(msgspec.Struct):
    model: str
    compute: str
    nctx: int
    state: str
    pid: int | None
    rss_bytes: int | None
    queue_depth: int
    inflight: int
    parallel: int
    last_used_s_ago: float
    requests_served: int
    tokens_generated: int
    keep_alive_s: float
    exit_reason: str | None = None
    engine: str | None = None
    provider: str | None = None  # what ran the model, as the worker measured it (e.g. QNNExecutionProvider)
    cpu_features: str | None = None  # what the engine's build uses (llama.cpp: its system info)
    devices: list[Device] = []  # the backend devices the engine's build sees, as its worker reported them
    ngl: int = 0  # the GPU layers asked for (-1, 999: all), as the worker's key has them
    offloaded_layers: int | None = None  # layers on a GPU/NPU device, of `n_layers` (llama.cpp's count)
    n_layers: int | None = None
    cache_bytes: int = 0  # host RAM in saved prompt states
    cache_evictions: int = 0
    disk_cache_bytes: int = 0  # its prompt states on disk (the data dir's prompt-cache/)
    disk_cache_hits: int = 0
    disk_cache_evictions: int = 0
    disk_cache_write_errors: int = 0
    runs_on: str | None = None  # the unit the worker really runs on (`compute` is the one asked for)
    fallback: str | None = None  # why it runs on the CPU instead of the unit asked for
    doctor_check: str | None = None  # the `geniex doctor` check that looks at that reason's cause
    # Its KV cache's types and one token's K and V in bytes, as the worker computed them from its model.
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    kv_bytes_per_token: int | None = None
    upstream: UpstreamInfo | None = None  # only for a model served elsewhere (engine "upstream")
    # Progress (gateway/supervisor/liveness.py): since it last sent anything (a heartbeat a second),
    # how long its engine's current step has run, and why it was found hung (while it is killed).
    heard_s_ago: float | None = None
    step_s: float = 0.0
    hung: str | None = None
    threads: int | None = None  # the CPU threads the gateway last gave it (its share of the cores); None: its own


class WorkerTable(msgspec.Struct):
    object: str
    data: list[WorkerInfo]
    power: PowerInfo | None = None  # the power source and `--on-battery`'s policy


@get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@get("/ready")
async def ready(lifecycle: NamedDependency[Lifecycle], services: NamedDependency[Services]) -> Response[dict[str, Any]]:
    """200 while the server takes requests; `recovering` names the models whose last worker crashed
    or hung (why, until a new one is ready): the server is ready, those models are restarting;
    `fallback` the workers that run on another unit than the one asked for, why, and the doctor's
    check of that cause (`geniex doctor`)."""
    if lifecycle.draining:
        return Response({"error": "draining: shutting down"}, status_code=503, headers={"Retry-After": "5"})
    if lifecycle.ready:
        recovering = dict(services.pool.crashed)
        fell_back = _fallbacks(services)
        return Response({"status": "ready", **({"recovering": recovering} if recovering else {}),
                         **({"fallback": fell_back} if fell_back else {})})  # fmt: skip
    return Response({"error": "starting: preloading models"}, status_code=503, headers={"Retry-After": "1"})


@get("/v1", include_in_schema=False)
async def v1_root() -> dict[str, str]:
    return {"status": "ok", "server": "geniex"}


@get("/v1/workers")
async def workers(services: NamedDependency[Services]) -> WorkerTable:
    pool = services.pool
    now = time.monotonic()
    rows = []
    for h in pool.workers.values():
        parallel = h.ready_info.parallel if h.ready_info else h.spec.worker.parallel
        rows.append(
            WorkerInfo(
                model=h.key.model,
                compute=h.key.compute,
                nctx=h.key.nctx,
                state=h.status,
                pid=h.pid,
                rss_bytes=h.rss(),
                queue_depth=max(0, h.inflight - parallel),
                inflight=h.inflight,
                parallel=parallel,
                last_used_s_ago=round(now - h.last_used, 3),
                requests_served=h.requests_served,
                tokens_generated=h.tokens_generated,
                keep_alive_s=pool.keep_alive_of(h),
                exit_reason=h.exit_reason,
                engine=h.ready_info.engine if h.ready_info else h.spec.engine,
                provider=(h.ready_info.provider or None) if h.ready_info else None,
                cpu_features=(h.ready_info.cpu_features or None) if h.ready_info else None,
                devices=h.ready_info.devices if h.ready_info else [],
                ngl=h.key.ngl,
                offloaded_layers=h.ready_info.offloaded_layers if h.ready_info and h.ready_info.n_layers else None,
                n_layers=(h.ready_info.n_layers or None) if h.ready_info else None,
                cache_bytes=h.cache_bytes,
                cache_evictions=h.cache_evictions,
                disk_cache_bytes=h.disk[0],
                disk_cache_hits=h.disk[1],
                disk_cache_evictions=h.disk[2],
                disk_cache_write_errors=h.disk[3],
                runs_on=h.ready_info.compute if h.ready_info else None,
                fallback=(h.ready_info.fallback or None) if h.ready_info else None,
                doctor_check=fallback_check(h.key.compute, h.ready_info.fallback) if h.ready_info else None,
                cache_type_k=(h.ready_info.cache_type_k or None) if h.ready_info else None,
                cache_type_v=(h.ready_info.cache_type_v or None) if h.ready_info else None,
                kv_bytes_per_token=(h.ready_info.kv_bytes_per_token or None) if h.ready_info else None,
                upstream=_upstream(h.upstream_health),
                heard_s_ago=round(now - h.last_heard, 3) if h.ready_info else None,
                step_s=round(h.beat.step_s + (now - h.beat_at) if h.beat.step_s else 0.0, 3),
                hung=h.hung,
                threads=h.threads,
            )
        )
    return WorkerTable(object="list", data=rows, power=pool.battery.info())


def _fallbacks(services: Services) -> list[dict[str, str | None]]:
    return [{"model": h.key.model, "compute": h.key.compute, "runs_on": h.ready_info.compute,
             "reason": h.ready_info.fallback, "doctor_check": fallback_check(h.key.compute, h.ready_info.fallback)}
            for h in services.pool.workers.values() if h.alive and h.ready_info and h.ready_info.fallback]  # fmt: skip


def _upstream(probe: UpstreamHealth | None) -> UpstreamInfo | None:
    if probe is None:
        return None
    return UpstreamInfo(url=probe.url, healthy=probe.healthy, detail=probe.detail, latency_ms=probe.latency_ms,
                        checked_s_ago=round(max(0.0, time.time() - probe.checked), 1))  # fmt: skip


handlers = [health, ready, v1_root, workers]
