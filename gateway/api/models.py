"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

from litestar import Request, get

from gateway.models.store import ModelEntry, ModelStore
from protocol.models import Model, ModelList


def _model(e: ModelEntry) -> Model:
    return Model(id=e.id, created=e.created, owned_by=e.org, engine=e.engine, size=e.size)


@get("/v1/models")
async def list_models(request: Request) -> ModelList:
    store: ModelStore = request.app.state.store
    return ModelList(data=[_model(e) for e in store.list()])


@get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> Model:
    store: ModelStore = request.app.state.store
    return _model(store.resolve(model_id.lstrip("/")))


handlers = [list_models, get_model]
