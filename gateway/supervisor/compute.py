"""Which compute unit a request can really have on this host."""

from __future__ import annotations

import functools
import struct
from pathlib import Path

import structlog

from protocol import engines, npu_plan, qnn
from protocol.gguf_header import npu_shape
from protocol.npu_bundle import serves_shared
from protocol.wire import Device, Ready

log = structlog.get_logger("gateway.supervisor.compute")

UNITS = ("cpu", "gpu", "npu", "hybrid")

# What each engine's build can use, as its workers' Ready said (by the gateway's name of the
# engine): whether it offloads to a GPU, and its devices. The gateway imports no engine, so an
# engine absent here is unknown until its first worker is ready; one machine, one build: learnt once.
_gpu_offload: dict[str, bool] = {}
_devices: dict[str, list[Device]] = {}


def learn(engine: str, ready: Ready) -> None:
    """Note what a worker of `engine` said of its build when it became ready."""
    _gpu_offload[engine] = ready.gpu_offload
    if ready.devices:
        _devices[engine] = ready.devices


def gpu_offload(engine: str) -> bool | None:
    """Whether `engine`'s build offloads to a GPU; None while no worker of it has said."""
    return _gpu_offload.get(engine)


def devices(engine: str) -> list[Device]:
    """The devices `engine`'s build sees ([] while no worker of it has said)."""
    return _devices.get(engine, [])


def has_htp(engine: str) -> bool:
    """Whether `engine` is llama.cpp built with its Hexagon backend, an HTP device seen: then a GGUF
    on `compute: npu` runs there, not through the ONNX/QNN conversion."""
    return any(d.name.upper().startswith("HTP") for d in devices(engine))


def resolve_compute(requested: str | None, engine: str) -> str:
    """The unit to run on, by the engine's row of protocol/engines.py; a unit the engine or the host
    cannot honour falls back to the CPU with a warning."""
    unit, why = choose(requested, engine)
    if why is not None:
        _warn_once((requested or "cpu").lower(), engine, why, unit)
    return unit


def choose(requested: str | None, engine: str) -> tuple[str, str | None]:
    """The unit to run on, and why it is not the one asked for (None when it is, or when `hybrid`
    runs on the GPU: a hybrid request asks for any accelerator beside the CPU)."""
    row = engines.info(engine)
    if row.remote:  # computed on another machine: no local unit, no share of the cores
        return "remote", None
    unit = (requested or "cpu").lower()
    if row.npu_only:
        # Its models are compiled for the NPU alone (a Genie bundle): the unit is the NPU whatever
        # was asked (the spec: "QAIRT is NPU-only; other aliases are coerced with a warning");
        # where the host has none, its worker answers why (a 503).
        if unit == "npu":
            return "npu", None
        return "npu", f"engine {engine} runs only on the NPU; `{unit}` is coerced to npu"
    if unit == "cpu":
        return "cpu", None
    if unit == "npu" and has_htp(engine):  # llama.cpp's own NPU backend
        return "npu", None
    if row.npu and (unit == "npu" or (unit == "hybrid" and row.hybrid)):
        # QNN runs the engine's graph (a chat GGUF is converted to one by llama_npu); when QNN
        # later refuses the graph, the worker runs on the CPU and says why.
        why = qnn.unavailable_reason()
        if why is None:
            return unit, None
        if unit == "hybrid" and row.gpu and gpu_offload(engine) is not False:
            return "gpu", None
        return "cpu", why
    if row.gpu and unit in ("gpu", "hybrid"):
        # Unknown (None): ask for the GPU; a worker whose build has no offload runs on the CPU and says why.
        if gpu_offload(engine) is not False:
            return "gpu", None
        return "cpu", "this llama.cpp build has no GPU offload"
    return "cpu", f"engine {engine} has no {unit} support here"


def why_not_exactly(requested: str, engine: str, model_path: str, nctx: int | None, npu_cache: Path) -> str | None:
    """Why `requested` cannot be had as asked, for a request that allows no fallback (None: it can,
    as far as the gateway can tell before a load; a worker that falls back after it says why in its
    Ready). An NPU chat model that cannot fit the SoC is refused here, naming its size and the limit,
    before anything is converted or compiled; one imported from a weight-shared bundle (in
    `npu_cache`, the workers' converted graphs) is planned with its weights once, as its worker loads it."""
    unit, why = choose(requested, engine)
    if why is not None:
        return f"`compute`: {requested} is not available for this model: {why}"
    if engines.info(engine).npu_only and (no_npu := qnn.unavailable_reason()) is not None:
        return f"`compute`: {requested} is not available for this model: {no_npu}"
    if unit in ("npu", "hybrid") and engines.info(engine).npu == "llama_npu" and not has_htp(engine):
        try:
            shared = serves_shared(npu_cache, model_path, unit)
            plan, _how = npu_plan.plan_here(npu_shape(model_path), nctx, shared_weights=shared)
        except (OSError, ValueError, KeyError, struct.error) as exc:
            return f"`compute`: {requested}: the model's GGUF header cannot be read ({exc})"
        if not plan.fits:
            return f"`compute`: {requested}: the model does not fit this NPU: {plan.why_not}"
    return None


@functools.cache
def _warn_once(unit: str, engine: str, why: str, to: str) -> None:
    log.warning(f"compute unit unavailable; falling back to {to}", requested=unit, engine=engine, reason=why)
