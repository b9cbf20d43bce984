"""GET /v1/models and /v1/models/{id}; POST /v1/models/load and /v1/models/unload.

What a model's entry says beyond the store (its aliases, its default settings, whether it is
listed, and where those come from) is asked of a `ModelFacts` provider (gateway/api/model_facts.py):
the one `Services` carries as `facts`, or NO_FACTS (nothing) while it carries none.
"""

from __future__ import annotations

from typing import Any

from litestar import get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, RawBody

from gateway.api.body import read_json
from gateway.api.model_facts import NO_FACTS, ModelFacts, NoFacts, facts_of
from gateway.api.services import Services
from gateway.models.capabilities import entry_capabilities
from gateway.models.store import ModelEntry
from gateway.supervisor.compute import choose, resolve_compute
from gateway.supervisor.handle import WorkerHandle
from gateway.supervisor.memory import template_thinks, trained_context, worker_engine
from gateway.supervisor.pool import WorkerPool
from protocol.models import LoadRequest, Model, ModelList, Resident, Unloaded, UnloadRequest

__all__ = ["NO_FACTS", "ModelFacts", "NoFacts", "handlers"]

# A model's state from its workers' (WorkerHandle.status), the first that any of them is in.
_STATES = (("busy", "busy"), ("idle", "ready"), ("starting", "loading"), ("stopping", "stopping"))


def _resident(pool: WorkerPool, h: WorkerHandle) -> Resident:
    state = h.state.value if h.state.value != "ready" else ("busy" if h.inflight else "idle")
    info = h.ready_info
    offloaded = info.offloaded_layers if info and info.n_layers else None
    return Resident(compute=h.key.compute, nctx=h.key.nctx, state=state, pid=h.pid, keep_alive=pool.keep_alive_of(h),
                    runs_on=info.compute if info else None, offloaded_layers=offloaded,
                    n_layers=(info.n_layers or None) if info else None,
                    devices=[d.name for d in info.devices if d.kind != "cpu"] if info and offloaded else [])  # fmt: skip


def model_state(pool: WorkerPool, model_id: str) -> str:
    """not_loaded, loading, ready, busy, stopping or failed: the model's workers in one word."""
    statuses = {h.status for k, h in pool.workers.items() if k.model == model_id}
    for status, word in _STATES:
        if status in statuses:
            return word
    if pool.loading(model_id):
        return "loading"
    if pool.backing_off(model_id) or model_id in pool.crashed:
        return "failed"
    return "not_loaded"


def model_view(e: ModelEntry, services: Services, facts: ModelFacts) -> Model:
    pool, settings = services.pool, services.settings
    engine = worker_engine(e)
    caps = entry_capabilities(engine, e.path, e.mmproj)
    defaults: dict[str, Any] = dict(facts.defaults(e.id))
    trained = trained_context(e.path)
    served: int | None = None
    if "chat" in caps or "completion" in caps:
        default_nctx = defaults.get("nctx")
        served = default_nctx if isinstance(default_nctx, int) and default_nctx > 0 else settings.nctx
        served = min(served, trained) if trained else served
    requested = defaults.get("compute") if isinstance(defaults.get("compute"), str) else settings.compute
    unit, _why = choose(requested, worker_engine(e, (requested or "cpu").lower()))
    return Model(id=e.id, created=e.created, owned_by=e.org, object="model", capabilities=caps,
                 loaded=[_resident(pool, h) for h in pool.residents_of(e.id)],
                 tools="tools" in caps, vision="vision" in caps,
                 reasoning=template_thinks(e.path) if "chat" in caps else False,
                 embeddings="embeddings" in caps, audio="transcription" in caps or "speech" in caps,
                 served_context=served, compute=unit, state=model_state(pool, e.id),
                 aliases=list(facts.aliases(e.id)), defaults=defaults, defaults_source=facts.source(e.id),
                 context_length=trained, quantization=e.precision, engine=e.engine, size=e.size)  # fmt: skip


@get("/v1/models")
async def list_models(services: NamedDependency[Services]) -> ModelList:
    facts = facts_of(services)
    return ModelList(data=[model_view(e, services, facts) for e in services.store.entries() if not facts.hidden(e.id)])


@get("/v1/models/{model_id:path}")
async def get_model(services: NamedDependency[Services], model_id: FromPath[str]) -> Model:
    return model_view(services.store.resolve(model_id.lstrip("/")), services, facts_of(services))


@post("/v1/models/load", status_code=200)
async def load_model(body: RawBody, services: NamedDependency[Services]) -> Model:
    """Load now (idempotent: an already loaded worker is only given the new keep_alive)."""
    data = read_json(body, LoadRequest)
    entry = services.store.resolve(data.model)
    await services.worker(entry, nctx=data.nctx, compute=data.compute, keep_alive=data.keep_alive, claim=False)
    return model_view(entry, services, facts_of(services))


@post("/v1/models/unload", status_code=200)
async def unload_model(body: RawBody, services: NamedDependency[Services]) -> Unloaded:
    """Stop the model's workers; 409 while any is serving (idempotent: nothing loaded, nothing done)."""
    data = read_json(body, UnloadRequest)
    entry = services.store.resolve(data.model)
    compute = resolve_compute(data.compute, entry.engine) if data.compute else None
    stopped = await services.pool.unload(entry.id, compute, data.nctx or None)
    return Unloaded(model=entry.id, unloaded=[_resident(services.pool, h) for h in stopped])


handlers = [list_models, get_model, load_model, unload_model]
