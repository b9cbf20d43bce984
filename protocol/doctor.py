"""What `geniex doctor` reports: one check per thing a compute unit needs, each named, so that a
worker's fallback (in /v1/workers and /ready) can point at the check that explains it.

The host's checks run in the gateway's process (files, device nodes, groups); the ones that need an
engine (llama.cpp's devices, a tiny generation, a 1-op QNN graph on the HTP) run in a subprocess of
their own (workers/doctor.py), so that a hang is killed at its bound instead of waited on.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Status = Literal["ok", "warn", "fail", "skip"]
UNITS = ("cpu", "gpu", "npu")

# Every check, its unit and what it looks at: the names are the contract with /v1/workers.
CHECKS: dict[str, str] = {
    "cpu.build": "the llama.cpp build and the CPU features it uses",
    "cpu.run": "a few tokens of the bundled model on the CPU",
    "gpu.backends": "the GPU devices llama.cpp's build sees (Vulkan, OpenCL, ...)",
    "gpu.drivers": "the Vulkan loader, the GPU's render nodes and OpenCL drivers",
    "gpu.offload_run": "a few tokens of the bundled model with every layer on the GPU",
    "npu.soc": "the SoC, from the device tree (Linux) or the processor's name (Windows)",
    "npu.qnn_runtime": "onnxruntime, onnxruntime-qnn and the QNN (QAIRT) version they carry",
    "npu.fastrpc_group": "the `fastrpc` group (fastrpc 1.0.5 and later) and whether this process is in it",
    "npu.udev_rules": "udev rules that give the FastRPC nodes to that group",
    "npu.fastrpc_nodes": "/dev/fastrpc-* (the cDSP's) and whether this process may open them",
    "npu.dma_heap": "the DMA-buf heaps (or ION) QNN shares buffers with the DSP through",
    "npu.skel_libs": "ADSP_LIBRARY_PATH and the Hexagon skel libraries for this SoC",
    "npu.cdsp_firmware": "the cDSP's remote processor and its firmware",
    "npu.htp_run": "a 1-op QNN graph run on the HTP, with a time bound",
    "npu.llama_htp": "llama.cpp's own Hexagon backend (HTP0), an alternative to QNN",
}


class Check(msgspec.Struct, omit_defaults=True):
    name: str  # a key of CHECKS
    status: Status
    detail: str
    fix: str = ""  # what to run or change, where there is something to do

    @property
    def unit(self) -> str:
        return self.name.split(".", 1)[0]


class UnitVerdict(msgspec.Struct, omit_defaults=True):
    unit: str
    usable: bool
    why: str = ""  # the first failed check's detail, when not usable
    check: str = ""  # that check's name


class Report(msgspec.Struct, omit_defaults=True):
    host: dict[str, str]
    units: list[UnitVerdict]
    checks: list[Check]
    sandbox: str = ""  # the systemd unit whose sandbox this report was made in (`--unit`)


def verdicts(checks: list[Check]) -> list[UnitVerdict]:
    """A unit is usable when none of its checks failed and at least one passed."""
    out = []
    for unit in UNITS:
        mine = [c for c in checks if c.unit == unit]
        failed = next((c for c in mine if c.status == "fail"), None)
        if failed is not None:
            out.append(UnitVerdict(unit, False, failed.detail, failed.name))
        elif any(c.status == "ok" for c in mine):
            out.append(UnitVerdict(unit, True))
        else:
            out.append(UnitVerdict(unit, False, "not checked" if not mine else mine[0].detail))
    return out


# A worker's fallback reason, by what it says, to the check that looks at that cause. The reasons are
# the engines' own (workers/engines/llama_runtime.py, protocol/qnn.py, workers/engines/onnx.py); an
# unmatched one on a unit falls to the unit's run check, which would fail for it too.
_FALLBACK_WORDS: tuple[tuple[str, str, str], ...] = (
    ("gpu", "no gpu offload", "gpu.backends"),
    ("gpu", "without gpu offload", "gpu.backends"),
    ("npu", "hexagon npu device", "npu.llama_htp"),
    ("npu", "onnxruntime-qnn", "npu.qnn_runtime"),
    ("npu", "no qnn device", "npu.qnn_runtime"),
    ("npu", "has no npu", "npu.soc"),
    ("npu", "only on a snapdragon, and", "npu.soc"),
)
_RUN_CHECK = {"cpu": "cpu.run", "gpu": "gpu.offload_run", "npu": "npu.htp_run", "hybrid": "npu.htp_run"}
# A reason about the model, not the unit: no doctor check explains it.
_MODEL_WORDS = (
    "gguf",
    "architecture",
    "not supported",
    "could not be converted",
    "vocabulary",
    "gb of npu memory",
    "context binary would hold",
)


def fallback_check(requested: str, reason: str) -> str | None:
    """The doctor's check that explains why a worker asked to run on `requested` runs elsewhere
    (None: the reason is the model's, or there is none)."""
    if not reason:
        return None
    said = reason.lower()
    unit = "npu" if requested == "hybrid" else requested
    if any(w in said for w in _MODEL_WORDS):
        return None
    for on, words, check in _FALLBACK_WORDS:
        if on == unit and words in said:
            return check
    return _RUN_CHECK.get(requested)
