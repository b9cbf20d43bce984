"""NPU bundles (protocol/npu_bundle.py): a manifest naming files outside its folder, or made for
another SoC, QNN or converter, is refused naming the file and the reason."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from protocol.npu_bundle import BUNDLE_FILE, GRAPHS_DIR, Bundle, BundleError, mismatch, read_bundle


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
