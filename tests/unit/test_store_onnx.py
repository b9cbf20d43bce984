"""Importing ONNX models into the store: folders, files, Hugging Face's onnx/ layout, refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gateway.errors import BadRequest
from gateway.models.store import ModelStore
from gateway.supervisor.memory import estimate_worker_bytes


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "data", bundled=[])


def onnx_dir(path: Path, *, graph: str = "model.onnx", tokenizer: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / graph).write_bytes(b"\x08\x08" + os.urandom(100))
    if tokenizer:
        (path / "tokenizer.json").write_text('{"model": {}}')
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (path / "pytorch_model.bin").write_bytes(b"not copied")
    return path


def test_import_a_folder(store: ModelStore, tmp_path: Path) -> None:
    src = onnx_dir(tmp_path / "src")
    (src / "model.onnx.data").write_bytes(b"external weights")
    entry = store.import_local(src, "acme/MiniLM:int8")
    assert (entry.id, entry.engine) == ("acme/MiniLM:int8", "onnx")
    folder = Path(entry.path)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [
        "1_Pooling/config.json", "model.onnx", "model.onnx.data", "tokenizer.json",
    ]  # fmt: skip
    assert entry.size == sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert store.resolve("acme/MiniLM") == entry
    manifest = json.loads((folder.parent / "manifest.json").read_text())
    assert manifest["engine"] == "onnx"
    assert estimate_worker_bytes(entry.path, 4096) > entry.size  # a folder is estimated by its files


def test_import_a_file_and_the_hf_onnx_layout(store: ModelStore, tmp_path: Path) -> None:
    src = onnx_dir(tmp_path / "repo" / "onnx", graph="model_fp16.onnx", tokenizer=False)
    (tmp_path / "repo" / "tokenizer.json").write_text("{}")
    entry = store.import_local(src / "model_fp16.onnx", "acme/E5")  # precision from the file name
    assert entry.id == "acme/E5:FP16"
    assert (Path(entry.path) / "model.onnx").is_file() and (Path(entry.path) / "tokenizer.json").is_file()
    assert store.import_local(tmp_path / "repo", "acme/E5-dir").id == "acme/E5-dir:FP16"  # its only graph


def test_refusals(store: ModelStore, tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match=r"tokenizer\.json"):
        store.import_local(onnx_dir(tmp_path / "notok", tokenizer=False), "acme/NoTok")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadRequest, match=r"no \.onnx"):
        store.import_local(empty, "acme/Empty")
    two = onnx_dir(tmp_path / "two")
    (two / "other.onnx").write_bytes(b"x")
    (two / "model.onnx").rename(two / "third.onnx")
    with pytest.raises(BadRequest, match="several ONNX models"):
        store.import_local(two, "acme/Two")
    store.import_local(onnx_dir(tmp_path / "ok"), "acme/Mixed:int8")
    gguf = tmp_path / "m.Q4_0.gguf"
    gguf.write_bytes(b"GGUF" + os.urandom(60))
    with pytest.raises(BadRequest, match="already holds onnx models"):
        store.import_local(gguf, "acme/Mixed:Q4_0")


def test_reimport_replaces_and_rm_removes_the_folder(store: ModelStore, tmp_path: Path) -> None:
    first = store.import_local(onnx_dir(tmp_path / "a"), "acme/M:int8")
    second = store.import_local(onnx_dir(tmp_path / "b"), "acme/M:int8")
    assert first.path == second.path and len(store.entries()) == 1
    assert [e.id for e in store.remove("acme/M")] == ["acme/M:int8"]
    assert not Path(first.path).exists() and store.entries() == []
