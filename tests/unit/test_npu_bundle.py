"""NPU bundles (protocol/npu_bundle.py): a manifest naming files outside its folder, or made for
another SoC, QNN or converter, is refused naming the file and the reason; one whose binaries share
their weights says so, and the worker loads them so only where they can load."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from protocol import npu_plan, qnn
from protocol.npu_bundle import (
    BUNDLE_FILE,
    GRAPHS_DIR,
    Bundle,
    BundleError,
    imported_shared,
    mismatch,
    qnn_version,
    read_bundle,
    shared_generation_refused,
    shared_load_refused,
)
from protocol.npu_cache import CONVERTER_VERSION


def _bundle(tmp_path: Path, **overrides: object) -> Path:
    folder = tmp_path / "bundle"
    (folder / GRAPHS_DIR).mkdir(parents=True)
    (folder / "m.gguf").write_bytes(b"GGUF")
    (folder / GRAPHS_DIR / "npu.json").write_text("{}")
    fields: dict[str, object] = {"model": "o/r:Q4_0", "gguf": "m.gguf", "soc": "x-elite", "qnn_version": "2.7.0",
                                 "converter_version": 3, "nctx": 1024, "files": ["npu.json"], **overrides}  # fmt: skip
    (folder / BUNDLE_FILE).write_bytes(msgspec.json.encode(fields))
    return folder


def test_a_bundle_reads_and_matches_only_its_soc_qnn_and_converter(tmp_path: Path) -> None:
    bundle = read_bundle(_bundle(tmp_path))
    assert isinstance(bundle, Bundle)
    assert mismatch(bundle, soc="x-elite", qnn_version="2.7.0", converter_version=3) is None
    assert "compiled for the x-elite and this machine is a 8-elite" in str(
        mismatch(bundle, soc="8-elite", qnn_version="2.7.0", converter_version=3))  # fmt: skip
    assert "onnxruntime-qnn 2.7.0" in str(mismatch(bundle, soc="x-elite", qnn_version="2.8.0", converter_version=3))
    assert "converter's version 3" in str(mismatch(bundle, soc="x-elite", qnn_version="2.7.0", converter_version=4))


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"files": ["../../etc/passwd"]}, "not a plain path"),
        ({"files": ["/etc/passwd"]}, "not a plain path"),
        ({"gguf": "../m.gguf"}, "not a plain path"),
        ({"gguf": "m.bin"}, "not a .gguf file"),
        ({"files": ["missing.onnx"]}, "does not exist"),
        ({"files": ["a\0b"]}, "not a plain path"),
        ({"format": 9}, "format 9"),
        ({"soc": 7}, "not a bundle manifest"),
    ],
)
def test_a_hostile_manifest_is_refused_naming_it(tmp_path: Path, overrides: dict[str, object], reason: str) -> None:
    folder = _bundle(tmp_path, **overrides)
    with pytest.raises(BundleError, match=reason) as refused:
        read_bundle(folder)
    assert str(folder / BUNDLE_FILE) in str(refused.value)


def test_a_link_out_of_the_bundle_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_text("x")
    folder = _bundle(tmp_path, files=["npu.json", "link.onnx"])
    os.symlink(outside, folder / GRAPHS_DIR / "link.onnx")
    with pytest.raises(BundleError, match=r"'link\.onnx' is not a file inside the bundle"):
        read_bundle(folder)


def test_no_manifest_or_garbage_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="cannot be read"):
        read_bundle(tmp_path)
    (tmp_path / BUNDLE_FILE).write_text("{not json")
    with pytest.raises(BundleError, match="not a bundle manifest"):
        read_bundle(tmp_path)


def test_a_manifest_says_whether_its_binaries_share_weights(tmp_path: Path) -> None:
    assert read_bundle(_bundle(tmp_path / "old")).shared_weights is False  # manifests from before the field
    assert read_bundle(_bundle(tmp_path / "new", shared_weights=True)).shared_weights is True


@pytest.mark.parametrize(("machine", "generated", "loaded"), [("x86_64", True, False), ("aarch64", False, True),
                                                               ("ARM64", False, True)])  # fmt: skip
def test_shared_binaries_are_compiled_on_x86_64_and_loaded_on_a_snapdragon(
    monkeypatch: pytest.MonkeyPatch, machine: str, generated: bool, loaded: bool
) -> None:
    monkeypatch.setattr(qnn.platform, "machine", lambda: machine)
    refused = shared_generation_refused()
    assert (refused is None) == generated
    assert refused is None or (f"on this {machine} machine" in refused and "compile MODEL --bundle OUT" in refused)
    refused = shared_load_refused()
    assert (refused is None) == loaded and (refused is None or "simulator crashes" in refused)


def test_the_shared_weights_flag_needs_a_bundle_and_an_x86_64_machine(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    from gateway.models.npu_cli import _check_shared_weights

    with pytest.raises(SystemExit, match="needs --bundle OUT"):
        _check_shared_weights(None)
    monkeypatch.setattr(qnn.platform, "machine", lambda: "aarch64")
    with pytest.raises(SystemExit, match="compiled only on x86_64"):
        _check_shared_weights(tmp_path / "out")


def test_an_imported_shared_bundle_is_loaded_shared_only_where_it_can_be(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:  # fmt: skip
    """import_bundle keeps the manifest with the graphs; the worker reads it, and on the simulator
    (this x86_64 host) leaves the binaries alone, since loading them would crash it."""
    from gateway.models.npu_cli import import_bundle
    from gateway.models.store import ModelStore
    from protocol.worker_args import WorkerArgs
    from workers.engines.npu.engine import loads_shared

    folder = _bundle(tmp_path, soc=npu_plan.detect_soc()[0].name, qnn_version=qnn_version(),
                     converter_version=CONVERTER_VERSION, shared_weights=True)  # fmt: skip
    (folder / "m.gguf").write_bytes(b"GGUF" + bytes(60))
    store = ModelStore(tmp_path / "data")
    entry = import_bundle(store, folder, "o/r:Q4_0")
    (converted,) = (tmp_path / "data" / "npu").iterdir()
    assert imported_shared(converted) and not imported_shared(tmp_path)

    def opts(compute: str) -> WorkerArgs:
        return WorkerArgs(engine="llama_npu", model_path=entry.path, compute=compute,
                          cache_dir=str(tmp_path / "data" / "npu"))  # fmt: skip

    monkeypatch.setattr(qnn.platform, "machine", lambda: "x86_64")
    assert not loads_shared(opts("npu"))
    monkeypatch.setattr(qnn.platform, "machine", lambda: "aarch64")
    assert loads_shared(opts("npu")) and not loads_shared(opts("hybrid"))
