"""The gateway's validation of `spec_*` fields, and where a draft model may be loaded from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.chat.speculation import speculation_of
from gateway.errors import BadRequest
from gateway.models.store import ModelEntry, ModelStore
from protocol.chat import ChatRequest
from protocol.wire import Speculation


def fake_gguf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + bytes(60))
    return path


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    bundled = fake_gguf(tmp_path / "site" / "bundled.gguf")
    entry = ModelEntry(id="Org/Bundled:Q4_1", org="Org", repo="Bundled", precision="Q4_1", engine="llama_cpp",
                       path=str(bundled), size=64, created=0, bundled=True)  # fmt: skip
    s = ModelStore(tmp_path / "data", bundled=[entry])
    s.import_local(fake_gguf(tmp_path / "src" / "draft.Q8_0.gguf"), "org/draft:Q8_0")
    return s


def spec(store: ModelStore, **fields: Any) -> Speculation | None:
    req = msgspec.convert({"model": "m", "messages": [], **fields}, ChatRequest)
    return speculation_of(req, store)


def refused(store: ModelStore, **fields: Any) -> str:
    with pytest.raises(BadRequest) as e:
        spec(store, **fields)
    return e.value.message


def test_no_spec_type_means_no_speculation(store: ModelStore) -> None:
    assert spec(store) is None
    assert spec(store, spec_type="") is None


def test_ngram_defaults_and_bounds(store: ModelStore) -> None:
    assert spec(store, spec_type="ngram-simple") == Speculation(type="ngram-simple", n_max=3)
    got = spec(store, spec_type="ngram-map-k", spec_n_max=8, spec_n_min=2, spec_p_min=0.5)
    assert got == Speculation(type="ngram-map-k", n_max=8, n_min=2, p_min=0.5)
    assert "spec_n_min" in refused(store, spec_type="ngram-simple", spec_n_max=2, spec_n_min=3)


@pytest.mark.parametrize("kind", ["draft-mtp", "draft-eagle3", "ngram-map-k4v", "ngram-mod", "ngram-cache", "medusa"])
def test_unimplemented_types_are_refused_by_name(store: ModelStore, kind: str) -> None:
    msg = refused(store, spec_type=kind, spec_draft_model="org/draft")
    assert kind in msg and "spec_type" in msg


def test_draft_simple_needs_a_draft_model(store: ModelStore) -> None:
    assert "spec_draft_model" in refused(store, spec_type="draft-simple")


def test_draft_by_catalogue_name(store: ModelStore) -> None:
    got = spec(store, spec_type="draft-simple", spec_draft_model="org/draft")
    assert got is not None and got.draft_path == os.path.realpath(store.resolve("org/draft:Q8_0").path)
    bundled = spec(store, spec_type="draft-simple", spec_draft_model="Org/Bundled:Q4_1")
    assert bundled is not None and bundled.draft_path == os.path.realpath(store.bundled[0].path)


def test_unknown_draft_name_says_pull_it(store: ModelStore) -> None:
    msg = refused(store, spec_type="draft-simple", spec_draft_model="org/missing:Q4_0")
    assert "geniex pull" in msg and "never downloads" in msg


def test_draft_by_absolute_path_inside_allowed_folders(store: ModelStore) -> None:
    inside = store.resolve("org/draft").path
    got = spec(store, spec_type="draft-simple", spec_draft_model=inside)
    assert got is not None and got.draft_path == os.path.realpath(inside)
    got = spec(store, spec_type="draft-simple", spec_draft_model=store.bundled[0].path)
    assert got is not None


def test_paths_that_escape_are_refused(store: ModelStore, tmp_path: Path) -> None:
    inside = Path(store.resolve("org/draft").path)
    outside = fake_gguf(tmp_path / "elsewhere" / "x.gguf")
    link_out_in = tmp_path / "elsewhere" / "link.gguf"  # lives outside, points at a store model
    link_out_in.symlink_to(inside)
    link_in_out = inside.parent / "escape.gguf"  # lives inside, points outside
    link_in_out.symlink_to(outside)
    dotdot = str(store.models_dir / ".." / ".." / "elsewhere" / "x.gguf")
    for path in ("/etc/passwd", str(outside), str(link_out_in), str(link_in_out), dotdot):
        assert "outside" in refused(store, spec_type="draft-simple", spec_draft_model=path), path


def test_relative_paths_missing_files_and_non_gguf_are_refused(store: ModelStore) -> None:
    assert "absolute" in refused(store, spec_type="draft-simple", spec_draft_model="./draft.gguf")
    missing = str(store.models_dir / "org" / "draft" / "nope.gguf")
    assert "no file" in refused(store, spec_type="draft-simple", spec_draft_model=missing)
    text = store.models_dir / "org" / "draft" / "notes.gguf"
    text.write_text("not a model")
    assert "not a GGUF" in refused(store, spec_type="draft-simple", spec_draft_model=str(text))


def test_wire_round_trip_and_older_messages_still_decode() -> None:
    from protocol.wire import Done, Generate, gateway_codec, worker_codec

    g, w = gateway_codec(), worker_codec()
    msg = Generate(
        req_id=1, log_id="r", prompt="x", speculation=Speculation(type="draft-simple", n_max=4, draft_path="/m.gguf")
    )
    assert w.decode(g.encode(msg)) == msg
    assert w.decode(g.encode(Generate(req_id=2, log_id="r", prompt="x"))).speculation is None
    done = Done(1, "stop", 5, 7, 0, accepted_tokens=4, rejected_tokens=2)
    assert g.decode(w.encode(done)) == done
    assert g.decode(w.encode(Done(1, "stop", 5, 7))).accepted_tokens == 0
