"""Which compute unit a request can really have on this host."""

from __future__ import annotations

import functools

import structlog

from protocol import engines, qnn
from protocol.wire import Ready

log = structlog.get_logger("gateway.supervisor.compute")

UNITS = ("cpu", "gpu", "npu", "hybrid")

# Whether each engine's build offloads to a GPU, as its workers' Ready said (by the gateway's name
# of the engine). The gateway imports no engine, so an engine absent here is unknown until its
# first worker is ready.
_gpu_offload: dict[str, bool] = {}


def learn(engine: str, ready: Ready) -> None:
    """Note what a worker of `engine` said of its build when it became ready."""
    _gpu_offload[engine] = ready.gpu_offload


def gpu_offload(engine: str) -> bool | None:
    """Whether `engine`'s build offloads to a GPU; None while no worker of it has said."""
    return _gpu_offload.get(engine)


def resolve_compute(requested: str | None, engine: str) -> str:
    """The unit to run on, by the engine's row of protocol/engines.py; a unit the engine or the host
    cannot honour falls back to the CPU with a warning."""
    row = engines.info(engine)
    if row.remote:  # computed on another machine: no local unit, no share of the cores
        return "remote"
    unit = (requested or "cpu").lower()
    if unit == "cpu":
        return "cpu"
    if row.npu and (unit == "npu" or (unit == "hybrid" and row.hybrid)):
        # QNN runs the engine's graph (a chat GGUF is converted to one by llama_npu); when QNN
        # later refuses the graph, the worker runs on the CPU and says why.
        why = qnn.unavailable_reason()
        if why is None:
            return unit
        if unit == "hybrid" and row.gpu and gpu_offload(engine) is not False:
            return "gpu"
        _warn_once(unit, engine, why)
        return "cpu"
    if row.gpu and unit in ("gpu", "hybrid"):
        # Unknown (None): ask for the GPU; a worker whose build has no offload runs on the CPU and says why.
        if gpu_offload(engine) is not False:
            return "gpu"
        _warn_once(unit, engine, "this llama.cpp build has no GPU offload")
        return "cpu"
    _warn_once(unit, engine, f"engine {engine} has no {unit} support here")
    return "cpu"


@functools.cache
def _warn_once(unit: str, engine: str, why: str) -> None:
    log.warning("compute unit unavailable; falling back to cpu", requested=unit, engine=engine, reason=why)
