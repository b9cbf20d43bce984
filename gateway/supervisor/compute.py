"""Which compute unit a request can really have on this host."""

from __future__ import annotations

import functools

import structlog

from protocol import qnn

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
    """The unit to run on; a unit the host cannot honour falls back to CPU with a warning."""
    if engine == "upstream":  # computed on another machine: no local unit, no share of the cores
        return "remote"
    unit = (requested or "cpu").lower()
    if unit == "cpu":
        return "cpu"
    if engine == "llama_cpp" and unit in ("npu", "hybrid"):
        # A chat GGUF: the NPU chat engine converts it to an ONNX graph for QNN, or, when its
        # architecture has no converter or QNN refuses the graph, runs it on the CPU and says why.
        why = qnn.unavailable_reason()
        if why is None:
            return unit
        if unit == "hybrid" and _gpu_offload():
            return "gpu"
        _warn_once(unit, engine, why)
        return "cpu"
    if engine in ("llama_cpp", "llama_embed"):
        if unit in ("gpu", "hybrid") and _gpu_offload():
            return "gpu"
        _warn_once(unit, engine, "this llama.cpp build has no GPU offload")
        return "cpu"
    if engine in ("onnx", "ocr") and unit == "npu":
        why = qnn.unavailable_reason()
        if why is None:
            return "npu"  # the worker runs the QNN execution provider, and reports whether it took the model
        _warn_once(unit, engine, why)
        return "cpu"
    _warn_once(unit, engine, f"engine {engine} has no {unit} support here")
    return "cpu"


@functools.cache
def _warn_once(unit: str, engine: str, why: str) -> None:
    log.warning("compute unit unavailable; falling back to cpu", requested=unit, engine=engine, reason=why)
