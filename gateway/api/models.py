"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

from litestar import get
from litestar.di import NamedDependency

from gateway.api.services import Services
from gateway.models.store import ModelEntry
from protocol.models import Model, ModelList


def _model(e: ModelEntry) -> Model:
    return Model(id=e.id, created=e.created, owned_by=e.org, engine=e.engine, size=e.size)


@get("/v1/models")
async def list_models(services: NamedDependency[Services]) -> ModelList:
    return ModelList(data=[_model(e) for e in services.store.entries()])


@get("/v1/models/{model_id:path}")
async def get_model(services: NamedDependency[Services], model_id: str) -> Model:
    return _model(services.store.resolve(model_id.lstrip("/")))


handlers = [list_models, get_model]
