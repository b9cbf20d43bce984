"""Ollama's model routes: tags, show, ps, version, copy, delete, embed and embeddings (its root
probe is gateway/dialects/ollama/root.py).

What Ollama reads from a model's manifest is read here from the store and the GGUF header: its
family (the architecture), parameter size (the weights' element count), quantization (the
variant's precision) and chat template. A `digest` is a stable hash of the variant's id, size and
time, not of its bytes (hashing a 5 GB file on every `/api/tags` would take seconds).
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime

from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import RawBody

from gateway.dialects.ollama.options import chat_fields, keep_alive_s
from gateway.dialects.ollama.resolve import entry_for, fitted_nctx, resolve
from gateway.errors import BadRequest, ModelNotFound
from gateway.http.auth import caller_of, require_manage
from gateway.http.body import read_json
from gateway.http.request_id import current_request_id
from gateway.http.services import Services
from gateway.http.vectors import ask, split_input, vectors
from gateway.models.capabilities import entry_capabilities
from gateway.models.copies import check_name
from gateway.models.store import ModelEntry
from gateway.supervisor.memory import gguf_meta, template_thinks, trained_context, worker_engine
from protocol import ollama as o
from protocol.gguf_header import ARCHITECTURE, CHAT_TEMPLATE, PARAMETERS
from protocol.wire import Embed, Embeddings

_NEVER = "2318-11-26T00:00:00Z"  # an `expires_at` for a pinned model (keep_alive -1), as Ollama writes one


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _size_label(n: int) -> str:
    """12_345_678 -> "12.35M"; Ollama's parameter_size."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def _digest(e: ModelEntry) -> str:
    return hashlib.sha256(f"{e.id}\0{e.size}\0{e.created}".encode()).hexdigest()


def _details(e: ModelEntry) -> o.Details:
    meta = gguf_meta(e.path)
    family = str(meta.get(ARCHITECTURE) or worker_engine(e))
    params = int(meta.get(PARAMETERS, 0) or 0)
    return o.Details(format="gguf" if e.path.endswith(".gguf") else e.engine, family=family, families=[family],
                     parameter_size=_size_label(params) if params else "", quantization_level=e.precision)  # fmt: skip


def _listed(name: str, e: ModelEntry) -> o.ListedModel:
    return o.ListedModel(name=name, model=name, modified_at=_rfc3339(e.created), size=e.size, digest=_digest(e),
                         details=_details(e))  # fmt: skip


@get("/api/tags")
async def tags(services: NamedDependency[Services]) -> o.Tags:
    """Every model this server can serve, by id, and each copy (`/api/copy`) by its own name."""
    facts = services.models_file
    entries = [e for e in services.store.entries() if not facts.hidden(e.id)]
    by_id = {e.id: e for e in entries}
    copies = [(alias, by_id[target]) for alias, target in services.store.copies.items() if target in by_id]
    return o.Tags(models=[*(_listed(e.id, e) for e in entries), *(_listed(a, e) for a, e in copies)])


def capabilities(e: ModelEntry) -> list[str]:
    """Ollama's words for what the model does: completion, tools, vision, embedding, thinking, insert."""
    caps = entry_capabilities(worker_engine(e), e.path, e.mmproj)
    meta = gguf_meta(e.path)
    out = ["completion"] if "chat" in caps or "completion" in caps else []
    out += [
        word for cap, word in (("tools", "tools"), ("vision", "vision"), ("embeddings", "embedding")) if cap in caps
    ]
    if "chat" in caps and template_thinks(e.path):
        out.append("thinking")
    if any(k.endswith((".fim_pre_token_id", ".prefix_token_id")) for k in meta):
        out.append("insert")
    return out


def _parameters(services: Services, e: ModelEntry) -> str:
    """The models file's defaults for the model, one `name value` per line, as a Modelfile's PARAMETERs."""
    return "\n".join(f"{k} {v!r}" if isinstance(v, str) else f"{k} {v}"
                     for k, v in services.models_file.defaults(e.id).items())  # fmt: skip


@post("/api/show", status_code=200)
async def show(body: RawBody, services: NamedDependency[Services]) -> o.Show:
    data = read_json(body, o.ModelRequest)
    if not data.which:
        raise BadRequest("`model` is required")
    e = resolve(services, data.which)
    meta = gguf_meta(e.path)
    details = _details(e)
    info: dict[str, object] = {"general.architecture": details.family, "general.basename": e.repo,
                               "general.quantization": e.precision}  # fmt: skip
    if params := int(meta.get(PARAMETERS, 0) or 0):
        info["general.parameter_count"] = params
    if trained := trained_context(e.path):
        info[f"{details.family}.context_length"] = trained
    for key in ("embedding_length", "block_count", "attention.head_count", "attention.head_count_kv"):
        if (value := meta.get(f"{details.family}.{key}")) is not None:
            info[f"{details.family}.{key}"] = int(value)
    template = str(meta.get(CHAT_TEMPLATE, ""))
    parameters = _parameters(services, e)
    modelfile = f"# Served by GenieX: {e.id}\nFROM {e.id}\n" + "".join(
        f"PARAMETER {p}\n" for p in parameters.splitlines()
    )
    return o.Show(modelfile=modelfile, parameters=parameters, template=template, details=details, model_info=info,
                  capabilities=capabilities(e), modified_at=_rfc3339(e.created))  # fmt: skip


@get("/api/ps")
async def ps(services: NamedDependency[Services]) -> o.Running:
    """The loaded models: one line per worker (a model loaded at two context sizes is two)."""
    pool = services.pool
    now_mono, now = time.monotonic(), time.time()
    out = []
    for e in services.store.entries():
        for h in pool.residents_of(e.id):
            keep = pool.keep_alive_of(h)
            expires = _NEVER if keep < 0 else _rfc3339(now + max(h.last_used + keep - now_mono, 0))
            host, device = pool.memory_of(h)
            out.append(o.RunningModel(name=e.id, model=e.id, size=host + device, digest=_digest(e), details=_details(e),
                                      expires_at=expires, size_vram=device, context_length=h.key.nctx))  # fmt: skip
    return o.Running(models=out)


@get("/api/version")
async def version() -> o.Version:
    return o.Version(o.OLLAMA_VERSION)


@post("/api/copy", status_code=200)
async def copy(request: Request, body: RawBody, services: NamedDependency[Services]) -> Response[bytes]:
    """A new name for a model (kept in the data dir's aliases.json); not a second copy of its file."""
    require_manage(request, "copy models")
    data = read_json(body, o.CopyRequest)
    e = resolve(services, data.source)
    dest = check_name(data.destination)
    try:
        taken = services.store.resolve(dest, plain=True)
    except ModelNotFound:
        taken = None
    if taken is not None:
        raise BadRequest(f"`destination`: {dest!r} is already the name of an installed model")
    services.store.copies.add(dest, e.id)
    return Response(b"", media_type="application/json")


@delete("/api/delete", status_code=200)
async def remove(request: Request, body: RawBody, services: NamedDependency[Services]) -> Response[bytes]:
    """A copy's name, or the model's files (every variant of `org/repo`, or the one named); refused
    while the model is loaded and answering."""
    require_manage(request, "delete models")
    data = read_json(body, o.ModelRequest)
    if not data.which:
        raise BadRequest("`model` is required")
    name = data.which
    if services.store.copies.remove(name):
        return Response(b"", media_type="application/json")
    e = resolve(services, name)
    if services.pool.residents_of(e.id):
        await services.pool.unload(e.id)  # 409 while it answers a request
    services.store.remove(e.id)
    for alias, target in services.store.copies.items():
        if target == e.id:
            services.store.copies.remove(alias)
    return Response(b"", media_type="application/json")


async def _embed(request: Request, services: Services, model: str, texts: list[str], *, truncate: bool,
                 dimensions: int | None, keep_alive: float | str | None,
                 options: dict[str, object] | None) -> tuple[Embeddings, int, int]:  # fmt: skip
    """(the worker's reply, ns spent loading, ns in all) for `texts` on `model`."""
    start = time.perf_counter_ns()
    split_input(list(texts))  # the checks /v1/embeddings makes: 1 to 2048 texts, none empty
    fields = chat_fields(options)  # only num_ctx and num_gpu mean anything to an embedder
    entry = entry_for(services, model, "embeddings")
    accounting = services.accounting(entry.id, caller_of(request), None)
    worker = await accounting.guard(services.worker(entry, nctx=fitted_nctx(services, entry, fields.get("nctx")),
                                                    ngl=fields.get("ngl"),
                                                    keep_alive=keep_alive_s(keep_alive)))  # fmt: skip
    loaded = time.perf_counter_ns()
    message = Embed(0, current_request_id() or "", texts=texts, dimensions=dimensions or 0, truncate=truncate)
    reply = await accounting.guard(ask(request, worker, entry, message))
    assert isinstance(reply, Embeddings)
    accounting.settle("ok", reply.prompt_tokens, 0)
    return reply, loaded - start, time.perf_counter_ns() - start


@post("/api/embed", status_code=200)
async def embed(request: Request, body: RawBody, services: NamedDependency[Services]) -> o.EmbedResponse:
    data = read_json(body, o.EmbedRequest)
    texts = [data.input] if isinstance(data.input, str) else data.input
    reply, load_ns, total_ns = await _embed(request, services, data.model, texts, truncate=data.truncate,
                                            dimensions=data.dimensions, keep_alive=data.keep_alive,
                                            options=data.options)  # fmt: skip
    rows = [v.embedding for v in vectors(reply, "float")]
    return o.EmbedResponse(model=data.model, embeddings=rows, total_duration=total_ns,  # type: ignore[arg-type]
                           load_duration=load_ns, prompt_eval_count=reply.prompt_tokens)  # fmt: skip


@post("/api/embeddings", status_code=200)
async def embeddings(request: Request, body: RawBody, services: NamedDependency[Services]) -> o.EmbeddingsResponse:
    """The older route: one `prompt`, one `embedding` (the same vector as `/api/embed`'s)."""
    data = read_json(body, o.EmbeddingsRequest)
    reply, _, _ = await _embed(request, services, data.model, [data.prompt], truncate=True, dimensions=None,
                               keep_alive=data.keep_alive, options=data.options)  # fmt: skip
    return o.EmbeddingsResponse(vectors(reply, "float")[0].embedding)  # type: ignore[arg-type]


handlers = [tags, show, ps, version, copy, remove, embed, embeddings]
