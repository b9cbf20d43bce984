"""Engines behind one small interface, and the registry that names them.

Adding an engine means one module here and one entry in `ENGINES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol

from protocol.wire import FromWorker, Generate, Ready


class EngineError(Exception):
    """A request the engine refuses; `status` is the HTTP status it deserves."""

    def __init__(self, message: str, *, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


Emit = Callable[[FromWorker], None]


class Engine(Protocol):
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
        """Decode with `n` threads from the next step on (engines without threads ignore it)."""
        ...

    def close(self) -> None: ...


class EngineOptions(Protocol):
    model_path: str
    compute: str
    nctx: int
    ngl: int
    parallel: int
    threads: int


# name -> "module:factory"; the factory takes EngineOptions and returns a loaded Engine.
ENGINES: dict[str, str] = {
    "llama_cpp": "workers.engines.llama:load",
}


def load_engine(name: str, options: EngineOptions) -> Engine:
    target = ENGINES.get(name)
    if target is None:
        raise EngineError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}", status=500)
    module, _, factory = target.partition(":")
    return getattr(importlib.import_module(module), factory)(options)
