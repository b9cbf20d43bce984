"""An NPU bundle: a chat model compiled for one Snapdragon once (`geniex npu compile`, on any machine
with the QNN libraries), to be imported on the laptop (`geniex pull --local BUNDLE`) so that its first
load takes about a second instead of a conversion and a compile.

    BUNDLE/bundle.json    this manifest
    BUNDLE/<name>.gguf    the model (the CPU engine and the tokenizer read it)
    BUNDLE/npu/...        the converted folder: graphs, weights, npu.json, QNN context binaries

A bundle is keyed by the SoC it was compiled for, the QNN plugin's version and the converter's
version: context binaries load only on the SoC and QNN they were built with, and the graph layout
changes with the converter. One that does not match is refused with the reason (the model still
imports, and is converted and compiled on the device when first loaded on the NPU).

Weight-shared bundles (`geniex npu compile --bundle OUT --shared-weights`): each part's prefill and
decode graphs in one context binary holding its weights once (workers/engines/npu/shared.py), so that
the NPU holds them once. onnxruntime-qnn generates those only on x86_64, and only a Snapdragon loads
them: Qualcomm's HTP simulator crashes loading one. An imported bundle's manifest is kept in its
converted folder, where the worker and the plan read whether its binaries share their weights.
"""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path

import msgspec

from protocol import qnn
from protocol.npu_cache import cache_key

BUNDLE_FILE = "bundle.json"
GRAPHS_DIR = "npu"
FORMAT = 1


class BundleError(Exception):
    """A bundle that cannot be imported as it is; the message names the file and the reason."""


class Bundle(msgspec.Struct, frozen=True, kw_only=True):
    format: int = FORMAT
    model: str  # the model's name where it was compiled, e.g. org/repo:Q4_0
    gguf: str  # the GGUF's file name, beside this manifest
    soc: str  # a protocol/npu_plan.py SOCS name
    qnn_version: str  # onnxruntime-qnn's version that compiled the context binaries
    converter_version: int  # protocol/npu_cache.py CONVERTER_VERSION that wrote the graphs
    nctx: int  # the context the compiled shapes attend over
    files: list[str]  # every file of npu/, relative to it
    # One context binary per part holds both shapes' graphs and the part's weights once. Older
    # manifests have no such field: their binaries are one per shape, each with its own weights.
    shared_weights: bool = False


def _inside(bundle: Path, base: Path, name: str, what: str) -> Path:
    """`base/name`, refused when the name could reach outside `base` (absolute, `..`, or a link)."""
    manifest = bundle / BUNDLE_FILE
    relative = Path(name)
    if not name or relative.is_absolute() or ".." in relative.parts or "\0" in name:
        raise BundleError(f"{manifest}: {what} {name!r} is not a plain path inside the bundle")
    path = base / relative
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise BundleError(f"{manifest}: {what} {name!r} does not exist in the bundle") from None
    if not resolved.is_relative_to(base.resolve()) or not resolved.is_file():
        raise BundleError(f"{manifest}: {what} {name!r} is not a file inside the bundle")
    return path


def read_bundle(folder: Path) -> Bundle:
    """The manifest, with every file it names checked to lie inside the bundle."""
    manifest = folder / BUNDLE_FILE
    try:
        bundle = msgspec.json.decode(manifest.read_bytes(), type=Bundle)
    except OSError as exc:
        raise BundleError(f"{manifest}: cannot be read ({exc.strerror or exc})") from None
    except msgspec.DecodeError as exc:
        raise BundleError(f"{manifest}: not a bundle manifest ({exc})") from None
    if bundle.format != FORMAT:
        raise BundleError(f"{manifest}: format {bundle.format}, this server reads format {FORMAT}")
    if not bundle.gguf.endswith(".gguf"):
        raise BundleError(f"{manifest}: the model {bundle.gguf!r} is not a .gguf file")
    _inside(folder, folder, bundle.gguf, "the model")
    for name in bundle.files:
        _inside(folder, folder / GRAPHS_DIR, name, "the file")
    return bundle


def mismatch(bundle: Bundle, *, soc: str, qnn_version: str, converter_version: int) -> str | None:
    """Why this machine cannot use the bundle's compiled graphs, or None."""
    if bundle.soc != soc:
        return f"it was compiled for the {bundle.soc} and this machine is a {soc}"
    if bundle.converter_version != converter_version:
        return (
            f"its graphs are the converter's version {bundle.converter_version}, this server writes {converter_version}"
        )
    if bundle.qnn_version != qnn_version:
        return f"it was compiled with onnxruntime-qnn {bundle.qnn_version} and this server has {qnn_version or 'none'}"
    return None


def qnn_version() -> str:
    """The installed QNN plugin's version ("" where there is none), read without importing it: what
    a bundle records and what its import is checked against."""
    try:
        return importlib.metadata.version("onnxruntime-qnn")
    except importlib.metadata.PackageNotFoundError:
        return ""


def shared_generation_refused() -> str | None:
    """Why this machine cannot compile weight-shared contexts, or None. onnxruntime-qnn switches QNN's
    weight sharing on only when generating offline on x86_64; on an Arm device it logs a warning and
    builds each context with its own weights, so the bundle would not share them."""
    if qnn.is_simulated():
        return None
    return (f"weight-shared NPU contexts are compiled only on x86_64 (onnxruntime-qnn generates them offline "
            f"there; on this {platform.machine()} machine it would give each context its own weights): run "
            "`geniex npu compile MODEL --bundle OUT --shared-weights` on an x86_64 machine with "
            "GENIEX_QNN_SIMULATOR=1 and import OUT here with `geniex pull NAME --local OUT`")  # fmt: skip


def shared_load_refused() -> str | None:
    """Why this machine cannot load weight-shared context binaries, or None. Qualcomm's HTP simulator
    (x86_64, libQnnHtp.so of onnxruntime-qnn 2.7.0) crashes the process (SIGSEGV in its context creation)
    loading a binary whose graphs share weights; onnxruntime-qnn's own test loads them only on a device."""
    if not qnn.is_simulated():
        return None
    return ("Qualcomm's HTP simulator crashes loading weight-shared context binaries (they load only on a "
            "Snapdragon): compiling unshared ones here")  # fmt: skip


def imported_shared(converted: Path) -> bool:
    """Whether a converted folder came from a weight-shared bundle (import_bundle keeps its manifest there)."""
    try:
        return msgspec.json.decode((converted / BUNDLE_FILE).read_bytes(), type=Bundle).shared_weights
    except (OSError, msgspec.DecodeError):
        return False


def serves_shared(npu_cache: Path, gguf_path: str, compute: str) -> bool:
    """Whether the NPU chat worker for this GGUF on `compute` loads weight-shared context binaries:
    its converted folder in `npu_cache` came from a bundle compiled with them, the unit is npu (they
    hold no CPU nodes) and this host can load them. The worker's load, the gateway's plan check and
    its memory estimate ask this one question, so that they agree on how many copies of the weights
    the NPU holds."""
    if compute != "npu" or shared_load_refused() is not None:
        return False
    try:
        return imported_shared(npu_cache / cache_key(gguf_path))
    except OSError:  # no such file: the worker's check_gguf says so
        return False
