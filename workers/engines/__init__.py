"""Engines behind one small interface, and the registry that names them.

Adding an engine means one module here and one entry in `ENGINES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol

from protocol.wire import Embed, FromWorker, Generate, Logits, Ready, Rerank


class EngineError(Exception):
    """A request the engine refuses; `status` is the HTTP status it deserves."""

    def __init__(self, message: str, *, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


Emit = Callable[[FromWorker], None]

# What each request kind asks of an engine, as a refusal names it.
TASKS: dict[type, str] = {Generate: "text generation", Logits: "logits", Embed: "embeddings", Rerank: "reranking"}
# The kinds an engine serves when it does not say (`Engine.serves`): the text-generation engines.
DEFAULT_SERVES: tuple[type, ...] = (Generate, Logits)


def serves(engine: object, request: object) -> bool:
    """Whether `engine` takes this kind of request (its `serves` tuple, else DEFAULT_SERVES)."""
    return type(request) in getattr(engine, "serves", DEFAULT_SERVES)


class Engine(Protocol):
    # Optional class attribute `serves`: the request kinds (Generate, Logits, Embed, Rerank) that
    # `submit` accepts; the worker answers any other kind with a 400 before it reaches `submit`.

    def ready(self) -> Ready:
        """Facts about the loaded model, sent once as the worker's first message."""
        ...

    def submit(self, req: Generate) -> None:
        """Queue a request; raise EngineError for one that can never be served."""
        ...

    def cancel(self, req_id: int, emit: Emit) -> None:
        """Drop a request, queued or running, and emit its Done(finish_reason="cancelled")."""
        ...

    def has_work(self) -> bool: ...

    def step(self, emit: Emit) -> None:
        """Advance every running request by one decode step, emitting Delta/Done/Failed."""
        ...

    def stats(self) -> tuple[int, int, int]:
        """(running, waiting, tokens generated since start)."""
        ...

    def set_threads(self, n: int) -> None:
        """Decode with at most `n` threads from the next step on (engines without threads ignore it)."""
        ...

    def idle(self) -> None:
        """Called about twice a second while there is no work (the llama.cpp engines read the
        machine's CPU use then, so the first step of the next request already fits it)."""
        ...

    def close(self) -> None: ...


class EngineOptions(Protocol):
    model_path: str
    compute: str
    nctx: int
    ngl: int
    parallel: int
    threads: int
    stream_interval_ms: int  # 0: send each token's text as it comes


# name -> "module:factory"; the factory takes EngineOptions and returns a loaded Engine.
ENGINES: dict[str, str] = {
    # A GGUF: text generation, or embeddings/reranking when the gateway's read of its header
    # says so (gateway/memory.py: is_embedding_gguf).
    "llama_cpp": "workers.engines.llama.engine:load",
    "llama_embed": "workers.engines.llama_embed:load",
    "onnx": "workers.engines.onnx:load",
}


def load_engine(name: str, options: EngineOptions) -> Engine:
    target = ENGINES.get(name)
    if target is None:
        raise EngineError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}", status=500)
    module, _, factory = target.partition(":")
    return getattr(importlib.import_module(module), factory)(options)
