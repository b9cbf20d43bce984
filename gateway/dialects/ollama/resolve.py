"""The model an Ollama route's `model` names (gateway/models/ollama_names.py's rule), checked for
what the route asks of it; a name nothing matches is Ollama's 404, `model "x" not found`. And the
context an Ollama request's `num_ctx` may have of it."""

from __future__ import annotations

import msgspec
import structlog

from gateway.errors import BadRequest, ModelNotFound
from gateway.http.services import Services
from gateway.models.ollama_names import pick, plain_name, short_matches
from gateway.models.store import ModelEntry
from gateway.supervisor.memory import trained_context
from protocol.chat import ChatRequest

log = structlog.get_logger("gateway.ollama")


def check_name(name: str) -> None:
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise BadRequest("`model`: a model name holds no control characters")


def resolve(services: Services, name: str) -> ModelEntry:
    """The model `name` means on Ollama's routes: the name, then without `:latest` or `hf.co/`,
    then as a short name."""
    check_name(name)
    store = services.store
    for tried in dict.fromkeys((name, plain_name(name))):
        try:
            return store.resolve(tried)
        except ModelNotFound as exc:
            if exc.code == "model_disabled":
                raise
    found = pick(short_matches(store.entries(), name), name)
    if isinstance(found, ModelEntry):
        return store.resolve(found.id)  # the models file may disable it
    hint = f": {found}" if found else "; `GET /api/tags` lists the models here"
    raise ModelNotFound(f'model "{name[:200]}" not found{hint}')


def entry_for(services: Services, name: str, capability: str) -> ModelEntry:
    """As Services.model_for, with Ollama's names: the entry, refused with a 400 when it cannot serve `capability`.
    A name other than the id stays in the request's log lines (billed under the id)."""
    entry = services.able(resolve(services, name), capability)
    if name != entry.id:
        structlog.contextvars.bind_contextvars(model_alias=name)
    return entry


def fitted_nctx(services: Services, entry: ModelEntry, nctx: int | None) -> int | None:
    """`options.num_ctx` as it can be served: past the model's trained context (or the operator's
    --max-nctx) it is lowered to that, as Ollama lowers it (with a warning), where `nctx` on the
    OpenAI routes is a 400. Cline asks every model for 32768."""
    if nctx is None:
        return None
    limit = services.settings.max_nctx or trained_context(entry.path)
    if limit is None or nctx <= limit:
        return nctx
    log.info("Ollama num_ctx lowered to what the model may be given", num_ctx=nctx, nctx=limit,
             why="--max-nctx" if services.settings.max_nctx else "its trained context")  # fmt: skip
    return limit


def fitted(services: Services, entry: ModelEntry, req: ChatRequest) -> ChatRequest:
    """`req` with its `nctx` (from `options.num_ctx`) as fitted_nctx serves it."""
    nctx = fitted_nctx(services, entry, req.nctx)
    return req if nctx == req.nctx else msgspec.structs.replace(req, nctx=nctx)
