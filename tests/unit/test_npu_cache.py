"""Converted NPU graphs that no model needs are removed: by `geniex rm` (the GGUF is gone) and by
the next conversion (an older version of the same GGUF)."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.models.store import ModelStore
from protocol.npu_cache import CONFIG_FILE, NPU_DIR, remove_stale, stale_folders


def converted(cache: Path, name: str, source: Path) -> Path:
    folder = cache / name
    folder.mkdir(parents=True)
    (folder / CONFIG_FILE).write_text(json.dumps({"arch": "llama", "source": str(source)}))
    (folder / "model.onnx").write_bytes(b"graph")
    return folder


def test_graphs_of_deleted_ggufs_and_older_versions_are_stale(tmp_path: Path) -> None:
    cache = tmp_path / NPU_DIR
    kept, gone = tmp_path / "kept.gguf", tmp_path / "gone.gguf"
    kept.write_bytes(b"GGUF")
    old = converted(cache, "kept-0001", kept)
    new = converted(cache, "kept-0002", kept)
    orphan = converted(cache, "gone-0001", gone)
    other = converted(cache, "other-0001", tmp_path / "other.gguf")
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    busy = cache / ".converting-abc"  # another process's conversion in progress: never touched
    busy.mkdir()
    odd = cache / "not-a-graph"  # no npu.json: not ours to judge
    odd.mkdir()
    assert stale_folders(cache) == [orphan]
    assert remove_stale(cache, current=new) == [orphan, old]
    assert sorted(p.name for p in cache.iterdir()) == sorted([new.name, other.name, busy.name, odd.name])
    assert stale_folders(tmp_path / "absent") == []


def test_rm_removes_the_graphs_converted_from_the_model(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = ModelStore(data, bundled=[])
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    entry = store.import_local(gguf, "test/npu-model:Q4_1")
    graph = converted(data / NPU_DIR, "m-0001", Path(entry.path).resolve())
    keep = tmp_path / "keep.gguf"
    keep.write_bytes(b"GGUF")
    unrelated = converted(data / NPU_DIR, "keep-0001", keep)
    store.remove("test/npu-model:Q4_1")
    assert not graph.exists() and unrelated.exists()
