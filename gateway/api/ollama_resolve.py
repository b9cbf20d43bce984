"""The model an Ollama route's `model` names (gateway/models/ollama_names.py's rule), checked for
what the route asks of it; a name nothing matches is Ollama's 404, `model "x" not found`."""

from __future__ import annotations

import structlog

from gateway.api.services import Services
from gateway.errors import BadRequest, ModelNotFound
from gateway.models.ollama_names import pick, plain_name, short_matches
from gateway.models.store import ModelEntry


def check_name(name: str) -> None:
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise BadRequest("`model`: a model name holds no control characters")


def resolve(services: Services, name: str) -> ModelEntry:
    """The model `name` means on Ollama's routes: the name, then without `:latest` or `hf.co/`,
    then as a short name."""
    check_name(name)
    for tried in dict.fromkeys((name, plain_name(name))):
        try:
            return services.store.resolve(tried)
        except ModelNotFound as exc:
            if exc.code == "model_disabled":
                raise
    found = pick(short_matches(services.store.entries(), name), name)
    if isinstance(found, ModelEntry):
        return services.store.resolve(found.id)  # the models file may disable it
    hint = f": {found}" if found else "; `GET /api/tags` lists the models here"
    raise ModelNotFound(f'model "{name[:200]}" not found{hint}')


def entry_for(services: Services, name: str, capability: str) -> ModelEntry:
    """As Services.model_for, with Ollama's names: the entry, refused with a 400 when it cannot serve `capability`.
    A name other than the id stays in the request's log lines (billed under the id)."""
    entry = services.model_for(resolve(services, name).id, capability)
    if name != entry.id:
        structlog.contextvars.bind_contextvars(model_alias=name)
    return entry
