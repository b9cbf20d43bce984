"""What every handler may use, typed: the long-lived objects the app owns, and the one way a
request finds its worker and its accounting.

Handlers receive a `Services` by dependency injection (`services: NamedDependency[Services]`), never by reading
untyped `app.state` attributes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import structlog
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.di import NamedDependency

from gateway.chat.reasoning_budget import with_server_budget
from gateway.errors import BadRequest, Unsupported
from gateway.http.lifecycle import Lifecycle
from gateway.http.model_facts import ModelFacts
from gateway.http.priority import priority_of
from gateway.mcp.hub import Hub
from gateway.media.images import chat_images
from gateway.media.inputs import MediaLimits
from gateway.models.capabilities import capabilities_of, serving
from gateway.models.models_file import ModelsFile, R
from gateway.models.pulls import Pulls
from gateway.models.store import ModelEntry, ModelStore
from gateway.ops.accounting import Accounting
from gateway.ops.energy import EnergyMeter
from gateway.ops.ledger import Ledger
from gateway.ops.limits import KeyLimiter
from gateway.ops.metrics import Metrics
from gateway.ops.settings import Settings
from gateway.supervisor.compute import why_not_exactly
from gateway.supervisor.deadline import within
from gateway.supervisor.handle import WorkerHandle
from gateway.supervisor.memory import trained_context, worker_engine
from gateway.supervisor.pool import WorkerPool
from protocol.chat import ChatMessage, ChatRequest
from protocol.limits import MAX_PROMPT_CHARS_PER_TOKEN
from protocol.npu_cache import NPU_DIR
from protocol.priority import Priority
from protocol.wire import ImageInput


@dataclass(frozen=True, slots=True)
class Services:
    settings: Settings
    store: ModelStore
    pool: WorkerPool
    ledger: Ledger
    metrics: Metrics
    lifecycle: Lifecycle
    limiter: KeyLimiter
    # `--models-file`: aliases (the store resolves them), per-model defaults, hidden and disabled models
    models_file: ModelsFile = field(default_factory=ModelsFile)
    pulls: Pulls = field(default_factory=Pulls)  # downloads running in the server (POST /v1/models/pull, /api/pull)
    mcp: Hub = field(default_factory=lambda: Hub({}))  # `--mcp-config`'s servers, for the Responses `mcp` tool
    # Each answer's share of the machine's energy, where the OS reports it (gateway/ops/energy.py)
    energy: EnergyMeter = field(default_factory=lambda: EnergyMeter(None))

    @property
    def facts(self) -> ModelFacts:
        """What /v1/models shows of the models file (gateway/http/model_facts.py's ModelFacts)."""
        return self.models_file

    @property
    def media(self) -> MediaLimits:
        """How large an image or audio clip may be, and which hosts a URL may name."""
        s = self.settings
        return MediaLimits(s.max_body_mb << 20, frozenset(h.lower() for h in s.fetch_hosts))

    async def images(self, messages: list[ChatMessage], entry: ModelEntry, max_length: int | None = None,
                     fields: list[str] | None = None) -> list[ImageInput]:  # fmt: skip
        """A chat request's images for `entry`, read and checked before a model loads (every dialect)."""
        return await chat_images(messages, model_id=entry.id, vision=bool(entry.mmproj), limits=self.media,
                                 media_dirs=self.settings.media_dirs, max_length=max_length, fields=fields)  # fmt: skip

    def model_for(self, name: str | None, capability: str, default: str | None = None) -> ModelEntry:
        """The model `name` (or `default`), refused with a 400 that says so when it cannot serve `capability`
        (text to speech asked of a chat model): checked before any worker loads."""
        if not name and default is None:
            raise BadRequest("`model` is required")
        entry = self.store.resolve(name or default or "")
        if name and name.lower() in (a.lower() for a in self.models_file.aliases(entry.id)):
            # Billed under the model's id; the request's log lines (its summary line too) keep the alias.
            structlog.contextvars.bind_contextvars(model_alias=name)
        return self.able(entry, capability)

    def able(self, entry: ModelEntry, capability: str) -> ModelEntry:
        """`entry`, or a 400 naming the models that can serve `capability` when it cannot."""
        if capability not in capabilities_of(worker_engine(entry), entry.path):
            entries = self.store.entries()
            able = serving({e.id: worker_engine(e) for e in entries}, capability, {e.id: e.path for e in entries})
            hint = f"models that do: {', '.join(able)}" if able else "no installed model does"
            raise Unsupported(f"`model`: {entry.id} ({entry.engine}) does not support {capability}; {hint}")
        return entry

    def with_defaults(self, req: R, entry: ModelEntry) -> R:
        """`req` with the models file's defaults for `entry` in every field the request left unset
        (sampling, stop, max_tokens, reasoning, and a system prompt when it has no system message),
        then the server's own (`--reasoning-budget`)."""
        req = self.models_file.with_defaults(req, entry)
        if isinstance(req, ChatRequest):
            return with_server_budget(req, self.settings.reasoning_budget)  # type: ignore[return-value]  # R is ChatRequest here
        return req

    def priority(self, request: ASGIConnection, entry: ModelEntry) -> Priority:
        """Where the request stands in its engine's queue and steps: its `GenieX-Priority` header,
        else the models file's default for `entry`, never above its API key's (gateway/http/priority.py)."""
        own = self.models_file.settings_of(entry.id)
        return priority_of(request, own.priority if own is not None else None)

    def accounting(self, model: str, caller: str, user: str | None) -> Accounting:
        """A request's metrics, ledger entry and tokens against its key's limits (`caller`: the API
        key's label); made once the model is resolved, so the `model` label is always a known id."""
        timer = self.metrics.timer(model, time.perf_counter())
        ledger = self.ledger.recorder(model, caller, user)

        def record(prompt_tokens: int, completion_tokens: int, energy_j: float | None) -> None:
            self.limiter.spend(caller, prompt_tokens + completion_tokens)
            ledger(prompt_tokens, completion_tokens, energy_j)

        def count_energy(compute: str, joules: float) -> None:
            self.metrics.answered_with(model, compute, joules)

        return Accounting(timer, record, self.energy, count_energy)

    async def worker(self, entry: ModelEntry, *, nctx: int | None = None, compute: str | None = None,
                     ngl: int | None = None, keep_alive: float | None = None,
                     prompt_chars: int = 0, draft_path: str = "", claim: bool = True,
                     fallback: bool | None = None) -> WorkerHandle:  # fmt: skip
        """The worker for this model and these per-request settings, started if need be; the
        request's log lines name it from here on. A request that asks for more context than it
        may, or whose prompt (`prompt_chars` of text) cannot fit, is refused before any load.
        `claim`: false for a load that sends the worker nothing (see WorkerHandle.claim).
        `fallback`: false refuses (400) a compute unit that cannot be had as asked instead of running
        on the CPU (None: the server's `--no-compute-fallback`)."""
        defaults = self.models_file.settings_of(entry.id)
        if defaults is not None:  # the models file's, where the request has none
            nctx = nctx or defaults.nctx
            compute = compute or defaults.compute
            ngl = defaults.ngl if ngl is None else ngl
        nctx = nctx or None  # 0: the server's default, as absent
        key = self.pool.key_for(entry, nctx, compute, ngl)
        if nctx is not None:
            check_nctx(nctx, entry, self.settings.max_nctx)
        check_prompt_chars(prompt_chars, key.nctx)
        requested = compute or self.settings.compute
        strict = bool(requested) and not (self.settings.compute_fallback if fallback is None else fallback)
        if strict and requested:
            npu_cache = self.settings.data_dir / NPU_DIR  # where an imported bundle's graphs are
            if why := why_not_exactly(requested, worker_engine(entry), entry.path, key.nctx, npu_cache):
                raise BadRequest(why)
        worker = await within(self.pool.get(key, entry, claim=claim))  # no longer than the request's deadline
        if strict and worker.ready_info is not None and worker.ready_info.fallback:
            if claim:
                self.pool.claims.release(key)
            raise BadRequest(f"`compute`: {requested} is not available for this model: {worker.ready_info.fallback}")
        await self.pool.add_draft(worker, draft_path)
        structlog.contextvars.bind_contextvars(model=entry.id, worker_pid=worker.pid)
        if keep_alive is not None:
            worker.keep_alive = keep_alive
        return worker


def check_nctx(nctx: int, entry: ModelEntry, max_nctx: int) -> None:
    """A request's `nctx` is at most the operator's `--max-nctx`, or else the model's trained
    context: beyond it a model answers garbage, and its KV cache costs memory all the same."""
    limit = max_nctx or trained_context(entry.path)
    if limit is not None and nctx > limit:
        why = "the server's --max-nctx" if max_nctx else f"the context {entry.id} was trained for"
        raise BadRequest(f"`nctx`: {nctx} is more than {why} ({limit})")


def check_prompt_chars(chars: int, nctx: int) -> None:
    if chars > MAX_PROMPT_CHARS_PER_TOKEN * nctx:
        raise BadRequest(f"the prompt is {chars} characters, more than a context of {nctx} tokens can hold; "
                         "shorten it or ask for a larger `nctx`", code="context_length_exceeded")  # fmt: skip


def provide_services(state: State) -> Services:
    services: NamedDependency[Services] = state.services
    return services
