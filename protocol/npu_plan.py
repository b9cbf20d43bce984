"""Whether a chat model fits a Snapdragon's NPU, decided before anything is converted or compiled.

The gateway (`geniex npu plan`, its memory estimate) and the NPU chat worker (which refuses, with the
reason, before a compile that would run for minutes and then fail or swap the laptop) both read it.
Arithmetic only, from the model's shape: the converter (workers/engines/npu/convert.py) writes each
weight matrix at 4 bits (8 for what is 8-bit or Q6_K in the GGUF) in blocks of 32 with an fp32 scale,
norms and biases in fp32, the token embedding stays on the host, and a tied head is stored once.

The limits, from Qualcomm's and onnxruntime's documentation (not measured here: no Snapdragon):
- a QNN context binary holds at most 2 GB;
- a process has about 4 GB of NPU-side memory on the X Elite (and on the phone SoCs listed);
- prefill and decode contexts share one copy of the weights only where the binaries were generated
  with weight sharing, which QNN does offline on x86_64; built on the device, each context has its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import msgspec

GB = 1_000_000_000
# Bytes per weight as the converter writes them (MatMulNBits): 32 values in 16 (4-bit) or 32 (8-bit)
# bytes plus an fp32 scale (GGUF's Q4_0 and Q8_0 blocks, repacked).
Q4_BYTES = 20 / 32
Q8_BYTES = 36 / 32
# A part's weights: under the 2 GB binary limit with room for the graph and its activations.
PART_LIMIT = 1_500_000_000
# The KV buffer the NPU graph attends over on every step (its `past`): all of it crosses to the NPU
# each step, so the NPU chat worker caps its context well below what the CPU engine offers.
NPU_MAX_CTX = 1024


class Soc(NamedTuple):
    name: str
    title: str
    soc_model: int  # QNN's SoC id (the HTP backend's `soc_model` option, and the simulator's)
    htp_arch: str
    binary_limit: int  # bytes one context binary may hold
    process_limit: int  # NPU-side bytes one process may map


SOCS: dict[str, Soc] = {
    s.name: s
    for s in (
        Soc("x-elite", "Snapdragon X Elite / X Plus (X1E, X1P)", 60, "v73", 2 * GB, 4 * GB),
        Soc("8-gen-2", "Snapdragon 8 Gen 2 (SM8550)", 43, "v73", 2 * GB, 4 * GB),
        Soc("8-gen-3", "Snapdragon 8 Gen 3 (SM8650)", 57, "v75", 2 * GB, 4 * GB),
        Soc("8-elite", "Snapdragon 8 Elite (SM8750)", 69, "v79", 2 * GB, 4 * GB),
    )
}
DEFAULT_SOC = "x-elite"
# The device tree's `compatible` names a Linux Snapdragon's SoC.
COMPATIBLE = {"qcom,x1e": "x-elite", "qcom,x1p": "x-elite", "qcom,sm8550": "8-gen-2", "qcom,sm8650": "8-gen-3",
              "qcom,sm8750": "8-elite"}  # fmt: skip


def soc_by_model(soc_model: int) -> Soc | None:
    return next((s for s in SOCS.values() if s.soc_model == soc_model), None)


def detect_soc(environ: Mapping[str, str] = os.environ,
               compatible: Path = Path("/sys/firmware/devicetree/base/compatible")) -> tuple[Soc, str]:  # fmt: skip
    """The SoC whose limits apply, and how it was found: GENIEX_QNN_SOC_MODEL (the simulator's SoC
    too), else a Linux Snapdragon's device tree, else the X Elite, assumed (Windows on Arm, or a SoC
    this table does not know)."""
    if raw := environ.get("GENIEX_QNN_SOC_MODEL", "").strip():
        soc = soc_by_model(int(raw)) if raw.isdigit() else None
        if soc is not None:
            return soc, f"GENIEX_QNN_SOC_MODEL={raw}"
    try:
        names = compatible.read_bytes().split(b"\0")
    except OSError:
        names = []
    for name in names:
        for prefix, soc_name in COMPATIBLE.items():
            if name.decode(errors="replace").startswith(prefix):
                return SOCS[soc_name], f"the device tree says {name.decode(errors='replace')}"
    return SOCS[DEFAULT_SOC], f"assumed ({DEFAULT_SOC}): the SoC was not recognized"


class Shape(msgspec.Struct, frozen=True):
    """What the plan needs of a decoder: its GGUF header's numbers."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    head_bits: int = 4  # 8 where the GGUF's output matrix is 8-bit or Q6_K
    layer_eight_bit: float = 0.0  # the share of the layers' weights kept at 8 bits (8-bit or Q6_K in the GGUF)

    @property
    def layer_params(self) -> int:
        q_out = self.n_head * self.head_dim
        kv = self.n_head_kv * self.head_dim
        return self.n_embd * (2 * q_out + 2 * kv) + 3 * self.n_embd * self.n_ff

    @property
    def params(self) -> int:
        """Weights on the NPU: the layers and the head (the token embedding stays on the host)."""
        return self.n_layer * self.layer_params + self.n_vocab * self.n_embd

    def layer_bytes(self) -> int:
        rate = self.layer_eight_bit * Q8_BYTES + (1 - self.layer_eight_bit) * Q4_BYTES
        return int(self.layer_params * rate) + 2 * 4 * self.n_embd  # two RMSNorm weights in fp32

    def head_bytes(self) -> int:
        return int(self.n_vocab * self.n_embd * (Q8_BYTES if self.head_bits == 8 else Q4_BYTES)) + 4 * self.n_embd

    def kv_bytes(self, nctx: int) -> int:
        """The fp16 KV cache the host keeps and binds (K and V, every layer)."""
        return 2 * 2 * self.n_layer * self.n_head_kv * self.head_dim * nctx


class Part(msgspec.Struct, frozen=True):
    first_layer: int
    end_layer: int  # exclusive
    weight_bytes: int
    head: bool  # the final norm and the head run in this part


class Plan(msgspec.Struct, frozen=True):
    soc: str
    params: int
    parts: list[Part]
    weight_bytes: int
    shared_weights: bool  # prefill and decode contexts share one copy of the weights
    process_bytes: int  # on the NPU side: weights once or twice, and the KV cache
    binary_bytes: int  # the largest context binary
    why_not: str = ""  # empty when it fits

    @property
    def fits(self) -> bool:
        return not self.why_not

    @property
    def bytes_per_param(self) -> float:
        return self.weight_bytes / max(1, self.params)


def split(shape: Shape, part_limit: int = PART_LIMIT) -> list[Part]:
    """Consecutive layers per part, each part's weights at most `part_limit` (a single layer over it
    is a part of its own: the plan then refuses it); the head goes with the last part, or after it
    in a part of its own when it does not fit there."""
    parts: list[Part] = []
    first, size = 0, 0
    layer = shape.layer_bytes()
    for i in range(shape.n_layer):
        if size and size + layer > part_limit:
            parts.append(Part(first, i, size, False))
            first, size = i, 0
        size += layer
    head = shape.head_bytes()
    if size + head <= part_limit or not size:
        parts.append(Part(first, shape.n_layer, size + head, True))
    else:
        parts += [Part(first, shape.n_layer, size, False), Part(shape.n_layer, shape.n_layer, head, True)]
    return parts


def plan(shape: Shape, soc: Soc, nctx: int, *, shared_weights: bool) -> Plan:
    parts = split(shape)
    weights = sum(p.weight_bytes for p in parts)
    copies = 1 if shared_weights else 2
    process = weights * copies + shape.kv_bytes(nctx)
    binary = max(p.weight_bytes for p in parts)  # one part's weights, shared or not, in each binary
    why = ""
    if binary > soc.binary_limit:
        why = (f"a context binary would hold {binary / GB:.2f} GB, over the {soc.binary_limit / GB:.2f} GB a QNN "
               f"context binary may hold on the {soc.title}")  # fmt: skip
    elif process > soc.process_limit:
        why = (f"the model needs {process / GB:.2f} GB of NPU memory ({weights / GB:.2f} GB of 4-bit weights"
               f"{'' if shared_weights else ' twice: prefill and decode contexts built on the device do not share them'}"
               f", and {shape.kv_bytes(nctx) / GB:.2f} GB of KV cache at nctx {nctx}), over the about "
               f"{soc.process_limit / GB:.2f} GB one process may use on the {soc.title}")  # fmt: skip
    return Plan(soc.name, shape.params, parts, weights, shared_weights, process, binary, why)


def npu_nctx(nctx: int | None) -> int:
    """The context the NPU chat worker runs for an asked `nctx` (0 or None: its cap)."""
    return min(nctx or NPU_MAX_CTX, NPU_MAX_CTX)


def plan_here(shape: Shape, nctx: int | None, *, shared_weights: bool = False) -> tuple[Plan, str]:
    """The plan for serving `shape` on this machine's SoC at the worker's context, and how the SoC
    was found. Built on the device, each context binary (prefill, decode) holds its own weights;
    `shared_weights`: the worker loads binaries compiled with weight sharing, from a bundle that says
    so (protocol/npu_bundle.py), and the weights count once."""
    soc, how = detect_soc()
    return plan(shape, soc, npu_nctx(nctx), shared_weights=shared_weights), how
