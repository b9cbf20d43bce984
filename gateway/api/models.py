"""GET /v1/models and /v1/models/{id}; POST /v1/models/load and /v1/models/unload."""

from __future__ import annotations

from litestar import get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, RawBody

from gateway.api.body import read_json
from gateway.api.services import Services
from gateway.models.capabilities import entry_capabilities
from gateway.models.store import ModelEntry
from gateway.supervisor.compute import resolve_compute
from gateway.supervisor.handle import WorkerHandle
from gateway.supervisor.memory import trained_context, worker_engine
from gateway.supervisor.pool import WorkerPool
from protocol.models import LoadRequest, Model, ModelList, Resident, Unloaded, UnloadRequest


def _resident(pool: WorkerPool, h: WorkerHandle) -> Resident:
    state = h.state.value if h.state.value != "ready" else ("busy" if h.inflight else "idle")
    info = h.ready_info
    offloaded = info.offloaded_layers if info and info.n_layers else None
    return Resident(compute=h.key.compute, nctx=h.key.nctx, state=state, pid=h.pid, keep_alive=pool.keep_alive_of(h),
                    runs_on=info.compute if info else None, offloaded_layers=offloaded,
                    n_layers=(info.n_layers or None) if info else None,
                    devices=[d.name for d in info.devices if d.kind != "cpu"] if info and offloaded else [])  # fmt: skip


def _model(e: ModelEntry, pool: WorkerPool) -> Model:
    return Model(id=e.id, created=e.created, owned_by=e.org, object="model",
                 capabilities=entry_capabilities(worker_engine(e), e.path, e.mmproj), context_length=trained_context(e.path),
                 quantization=e.precision, engine=e.engine, size=e.size,
                 loaded=[_resident(pool, h) for h in pool.residents_of(e.id)])  # fmt: skip


@get("/v1/models")
async def list_models(services: NamedDependency[Services]) -> ModelList:
    return ModelList(data=[_model(e, services.pool) for e in services.store.entries()])


@get("/v1/models/{model_id:path}")
async def get_model(services: NamedDependency[Services], model_id: FromPath[str]) -> Model:
    return _model(services.store.resolve(model_id.lstrip("/")), services.pool)


@post("/v1/models/load", status_code=200)
async def load_model(body: RawBody, services: NamedDependency[Services]) -> Model:
    """Load now (idempotent: an already loaded worker is only given the new keep_alive)."""
    data = read_json(body, LoadRequest)
    entry = services.store.resolve(data.model)
    await services.worker(entry, nctx=data.nctx, compute=data.compute, keep_alive=data.keep_alive, claim=False)
    return _model(entry, services.pool)


@post("/v1/models/unload", status_code=200)
async def unload_model(body: RawBody, services: NamedDependency[Services]) -> Unloaded:
    """Stop the model's workers; 409 while any is serving (idempotent: nothing loaded, nothing done)."""
    data = read_json(body, UnloadRequest)
    entry = services.store.resolve(data.model)
    compute = resolve_compute(data.compute, entry.engine) if data.compute else None
    stopped = await services.pool.unload(entry.id, compute, data.nctx or None)
    return Unloaded(model=entry.id, unloaded=[_resident(services.pool, h) for h in stopped])


handlers = [list_models, get_model, load_model, unload_model]
