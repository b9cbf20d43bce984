"""Weight-shared QNN contexts (`geniex npu compile MODEL --bundle OUT --shared-weights`, on x86_64):
each part's prefill and decode graphs compiled into one context binary that holds the part's weights
once, for a Snapdragon to load with both sessions sharing it (decoder.qnn_session_factory, `shared`).

onnxruntime's flow (its EP-context design, "EPContext with weight sharing"): sessions created with
`ep.share_ep_contexts=1` compile their graphs into one QNN context, for which onnxruntime-qnn switches
the HTP backend's weight sharing on (offline on x86_64 only); the last one, with
`ep.stop_share_ep_contexts=1`, writes the one binary that every session's EPContext model names.

In one such context the graphs' inputs and outputs are the context's names: prefill's `inputs_embeds`
and decode's (another shape) collide (QNN error 7003: the tensor already exists). So each shape is
compiled from a copy of the part's graph whose inputs and outputs carry the shape (`__s32`); the
EPContext model written is then renamed back to the graph's own names, its EPContext node mapping them
to the context's (onnxruntime-qnn's `io_name_overrides`), so the decoder runs it as any other.

Qualcomm's simulator writes these binaries but crashes loading them (protocol/npu_bundle.py
shared_load_refused), so they are written for a bundle, never into this machine's cache.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort
import structlog

from protocol import npu_plan
from workers.engines.npu.convert import DecoderConfig, GraphPart
from workers.engines.npu.decoder import CHUNK, context_file, session_options, shape_dims, shared_context_file

log = structlog.get_logger("worker.npu.shared")

IO_NAME_OVERRIDES = "io_name_overrides"  # the EPContext attribute: "graph_name=context_name;" per input/output
# A shared binary over this share of its part's weights holds them twice: the plugin did not share.
MAX_SHARED_RATIO = 1.5


class SharedWeightsError(Exception):
    """The QNN plugin could not compile weight-shared contexts; the message says why."""


@dataclass(frozen=True)
class SharedPart:
    graph: str  # the part's graph, in the converted folder
    binary: str  # its one context binary
    contexts: list[str]  # its EPContext models, prefill's then decode's, all naming `binary`
    nodes: list[str]  # their EPContext nodes' names: the graphs' names in the binary


def compile_shared(folder: Path, cfg: DecoderConfig, n_ctx: int, devices: list[Any], options: dict[str, str],
                   out: Path, threads: int = 2, seqs: tuple[int, ...] = ()) -> list[SharedPart]:  # fmt: skip
    """Every part's contexts, weight-shared, written into `out` (their EPContext models and binaries,
    named as the loader looks for them beside the graphs); the graphs in `folder` are read, not changed.
    `seqs`: the shapes, by default the decoder's two (a prefill chunk, one token); a test compiles the
    prefill's alone, a binary of one graph, which Qualcomm's simulator does load."""
    soc = npu_plan.detect_soc()[0].name
    parts = []
    for part in cfg.graph_parts():
        t0 = time.perf_counter()
        shapes = list(seqs) or [min(CHUNK, n_ctx), 1]
        shared = _compile_part(folder, part, n_ctx, shapes, soc, devices, options, out, threads)
        size = (out / shared.binary).stat().st_size
        _check_shared(shared, size, (folder / part.weights).stat().st_size)
        log.info("npu weight-shared contexts compiled", graph=part.graph, binary=shared.binary, mb=size >> 20,
                 seconds=round(time.perf_counter() - t0, 1))  # fmt: skip
        parts.append(shared)
    nodes = [n for p in parts for n in p.nodes]
    if len(set(nodes)) != len(nodes):  # the loader finds a session's graph among those loaded by its name
        raise SharedWeightsError(f"two graphs have the same name in the shared contexts: {sorted(nodes)}")
    return parts


def _compile_part(folder: Path, part: GraphPart, n_ctx: int, shapes: list[int], soc: str, devices: list[Any],
                  options: dict[str, str], out: Path, threads: int) -> SharedPart:  # fmt: skip
    graph = folder / part.graph
    contexts = []
    for i, seq in enumerate(shapes):
        dims = shape_dims(seq, n_ctx)
        ctx = out / shared_context_file(context_file(graph, dims, soc, cpu_fallback=False)).name
        suffix = f"__s{seq}"
        so = session_options(dims, threads)
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # compute npu: all of it on QNN
        for key, value in {"ep.context_enable": "1", "ep.context_file_path": str(ctx), "ep.context_embed_mode": "0",
                           "ep.share_ep_contexts": "1"}.items():  # fmt: skip
            so.add_session_config_entry(key, value)
        if i == len(shapes) - 1:
            so.add_session_config_entry("ep.stop_share_ep_contexts", "1")  # this one writes the binary
        so.add_provider_for_devices(devices[:1], options)
        with _renamed_io(graph, suffix) as copy:
            try:
                ort.InferenceSession(str(copy), sess_options=so)
            except Exception as exc:  # noqa: BLE001 - the plugin's refusal, whatever its type, is the reason
                raise SharedWeightsError(f"{part.graph} at {seq} tokens: {type(exc).__name__}: {exc}") from None
        contexts.append(ctx)
    named = [_restore_io(ctx, f"__s{seq}") for ctx, seq in zip(contexts, shapes, strict=True)]
    binaries = {binary for binary, _node in named}
    if len(binaries) != 1 or not (out / next(iter(binaries))).is_file():
        raise SharedWeightsError(f"{part.graph}: the contexts name {sorted(binaries)}, not one binary written: the "
                                 "QNN plugin did not compile them into one shared context")  # fmt: skip
    return SharedPart(part.graph, binaries.pop(), [c.name for c in contexts], [node for _binary, node in named])


@contextmanager
def _renamed_io(graph: Path, suffix: str) -> Iterator[Path]:
    """A copy of `graph` beside it (its external weights are named relative to it), with `suffix` on
    every input and output name; removed after."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    names = {v.name: v.name + suffix for v in [*model.graph.input, *model.graph.output]}
    for value in [*model.graph.input, *model.graph.output]:
        value.name = names[value.name]
    for node in model.graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    copy = graph.with_name(f".{graph.stem}{suffix}.onnx")
    onnx.save(model, str(copy))
    try:
        yield copy
    finally:
        copy.unlink(missing_ok=True)


def _restore_io(ctx: Path, suffix: str) -> tuple[str, str]:
    """Rename the EPContext model's inputs and outputs back to the graph's (without `suffix`), its node
    mapping them to the context's names; the binary it names, and its node's name."""
    import onnx
    from onnx import helper

    model = onnx.load(str(ctx))  # EPContext nodes only (compute npu): a few KB
    nodes = list(model.graph.node)
    if len(nodes) != 1 or nodes[0].op_type != "EPContext":
        raise SharedWeightsError(f"{ctx.name}: {len(nodes)} nodes, not one EPContext node: QNN did not take the "
                                 "whole graph")  # fmt: skip
    node = nodes[0]
    attrs = {a.name: a for a in node.attribute}
    if IO_NAME_OVERRIDES in attrs or "ep_cache_context" not in attrs:
        raise SharedWeightsError(f"{ctx.name}: not the EPContext node this QNN plugin was seen to write")
    own = {n: n.removesuffix(suffix) for n in [*node.input, *node.output]}
    for value in [*model.graph.input, *model.graph.output]:
        value.name = own[value.name]
    node.input[:] = [own[n] for n in node.input]
    node.output[:] = [own[n] for n in node.output]
    node.attribute.append(helper.make_attribute(IO_NAME_OVERRIDES, "".join(f"{g}={c};" for c, g in own.items())))
    onnx.save(model, str(ctx))
    return attrs["ep_cache_context"].s.decode(), node.name


def _check_shared(shared: SharedPart, binary_bytes: int, weight_bytes: int) -> None:
    """A binary holding both shapes' weights is about twice its part's weights file; a shared one about
    once (SmolLM2: 97 MB for a 98.5 MB graph, against 183 MB for the two unshared binaries)."""
    if binary_bytes > MAX_SHARED_RATIO * weight_bytes:
        raise SharedWeightsError(f"{shared.binary}: {binary_bytes >> 20} MiB for {weight_bytes >> 20} MiB of weights: "
                                 "the QNN plugin compiled each shape with its own copy")  # fmt: skip
