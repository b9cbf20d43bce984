"""GET /v1/models and /v1/models/{id}; POST /v1/models/load and /v1/models/unload.

What a model's entry says beyond the store (its aliases, its default settings, whether it is
listed, and where those come from) is asked of a `ModelFacts` provider (gateway/http/model_facts.py):
the one `Services` carries as `facts`, or NO_FACTS (nothing) while it carries none.
"""

from __future__ import annotations

from litestar import get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, RawBody

from gateway.http.body import read_json
from gateway.http.model_facts import facts_of
from gateway.http.model_view import model_view, resident_view
from gateway.http.services import Services
from gateway.supervisor.compute import resolve_compute
from protocol.models import LoadRequest, Model, ModelList, Unloaded, UnloadRequest


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
    return Unloaded(model=entry.id, unloaded=[resident_view(services.pool, h) for h in stopped])


handlers = [list_models, get_model, load_model, unload_model]
