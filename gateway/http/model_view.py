"""A model as /v1/models shows it: its entry, what it can do, and its workers' state; the one view
GenieX's own routes (`/api/pull`'s answer) show too."""

from __future__ import annotations

from typing import Any

from gateway.http.model_facts import ModelFacts
from gateway.http.services import Services
from gateway.models.capabilities import entry_capabilities
from gateway.models.store import ModelEntry
from gateway.supervisor.compute import choose
from gateway.supervisor.handle import WorkerHandle
from gateway.supervisor.memory import template_thinks, trained_context, worker_engine
from gateway.supervisor.pool import WorkerPool
from protocol.models import Model, Resident

# A model's state from its workers' (WorkerHandle.status), the first that any of them is in.
_STATES = (("busy", "busy"), ("idle", "ready"), ("starting", "loading"), ("stopping", "stopping"))


def resident_view(pool: WorkerPool, h: WorkerHandle) -> Resident:
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
                 loaded=[resident_view(pool, h) for h in pool.residents_of(e.id)],
                 tools="tools" in caps, vision="vision" in caps,
                 reasoning=template_thinks(e.path) if "chat" in caps else False,
                 embeddings="embeddings" in caps, audio="transcription" in caps or "speech" in caps,
                 served_context=served, compute=unit, state=model_state(pool, e.id),
                 aliases=list(facts.aliases(e.id)), defaults=defaults, defaults_source=facts.source(e.id),
                 context_length=trained, quantization=e.precision, engine=e.engine, size=e.size)  # fmt: skip
