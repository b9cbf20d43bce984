"""Which compute unit a request can really have on this host."""

from __future__ import annotations

import functools

import structlog

from protocol import engines, qnn

log = structlog.get_logger("gateway.supervisor.compute")

UNITS = ("cpu", "gpu", "npu", "hybrid")


@functools.cache
def _gpu_offload() -> bool:
    try:
        import llama_cpp

        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:  # noqa: BLE001 - no llama.cpp build means no GPU either
        return False


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
        if unit == "hybrid" and row.gpu and _gpu_offload():
            return "gpu"
        _warn_once(unit, engine, why)
        return "cpu"
    if row.gpu and unit in ("gpu", "hybrid"):
        if _gpu_offload():
            return "gpu"
        _warn_once(unit, engine, "this llama.cpp build has no GPU offload")
        return "cpu"
    _warn_once(unit, engine, f"engine {engine} has no {unit} support here")
    return "cpu"


@functools.cache
def _warn_once(unit: str, engine: str, why: str) -> None:
    log.warning("compute unit unavailable; falling back to cpu", requested=unit, engine=engine, reason=why)
