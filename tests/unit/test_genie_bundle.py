"""protocol/genie_bundle.py: a Genie bundle is checked before anything loads it. Every file its
config names must be a relative path that resolves inside the folder and exists; a config that is
not JSON, too large, or lacks the fields Genie needs is refused, and each refusal names the file
and the field. The store imports a good bundle whole and a bad one not at all."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import BadRequest
from gateway.models.store import ModelStore
from protocol.genie_bundle import (
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    BundleError,
    is_bundle,
    loadable_config,
    precision_of,
    read_bundle,
)
from tests.genie_bundles import genie_config, write_bundle


def _with_bins(*bins: Any) -> dict[str, Any]:
    config = genie_config()
    config["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = list(bins)
    return config


def test_a_bundle_reads_with_its_files_sizes_and_context(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "llama_v3_2_3b_instruct-genie-w4a16-qualcomm_snapdragon_x_elite")
    b = read_bundle(folder)
    assert (b.tokenizer, b.ctx_bins, b.extensions, b.backend, b.context_size) == (
        "tokenizer.json", ("part1_of_2.bin", "part2_of_2.bin"), "htp_backend_ext_config.json", "QnnHtp", 512)  # fmt: skip
    assert b.files == (CONFIG_FILE, "tokenizer.json", "part1_of_2.bin", "part2_of_2.bin", "htp_backend_ext_config.json")
    assert b.total_bytes == sum((folder / f).stat().st_size for f in b.files)
    assert b.config == str(folder / CONFIG_FILE) and is_bundle(folder) and not is_bundle(tmp_path)
    assert precision_of(folder) == "w4a16" and precision_of(tmp_path / "x") is None


def test_the_loadable_config_names_every_file_by_its_absolute_path(tmp_path: Path) -> None:
    """Genie resolves relative paths against the working directory, not the config's folder."""
    config = genie_config(tokenizer={"version": 1, "path": "./tokenizer.json"})
    folder = write_bundle(tmp_path / "b", config)
    dialog = json.loads(loadable_config(folder))["dialog"]
    root = folder.resolve()
    assert dialog["tokenizer"]["path"] == str(root / "tokenizer.json")
    assert dialog["engine"]["model"]["binary"]["ctx-bins"] == [
        str(root / "part1_of_2.bin"),
        str(root / "part2_of_2.bin"),
    ]
    assert dialog["engine"]["backend"]["extensions"] == str(root / "htp_backend_ext_config.json")
    assert dialog["sampler"] == config["dialog"]["sampler"]  # the rest as the bundle wrote it
    assert read_bundle(folder).tokenizer == "tokenizer.json"  # "./" dropped: the name the copy uses


def test_a_speculative_dialogs_engines_are_all_checked(tmp_path: Path) -> None:
    target = genie_config()["dialog"]["engine"]
    draft = {**target, "model": {"type": "binary", "binary": {"ctx-bins": ["draft.bin"]}}}
    folder = write_bundle(tmp_path / "b", genie_config(engine=[draft, target]))
    with pytest.raises(BundleError, match=r"engine\[0\]\.model\.binary\.ctx-bins\[0\]: 'draft\.bin' does not exist"):
        read_bundle(folder)
    (folder / "draft.bin").write_bytes(b"d")
    assert read_bundle(folder).ctx_bins == ("draft.bin", "part1_of_2.bin", "part2_of_2.bin")


@pytest.mark.parametrize(
    ("name", "why"),
    [("../outside.bin", "not a relative path inside the bundle"),
     ("sub/../../outside.bin", "not a relative path inside the bundle"),
     ("ABSOLUTE", "not a relative path inside the bundle"),
     ("C:\\models\\part1.bin", "not a relative path inside the bundle"),
     ("missing.bin", "does not exist in the bundle")],
)  # fmt: skip
def test_a_context_binary_outside_the_folder_or_missing_is_refused_naming_it(tmp_path: Path, name: str,
                                                                              why: str) -> None:  # fmt: skip
    (tmp_path / "outside.bin").write_bytes(b"secret")
    name = str(tmp_path / "outside.bin") if name == "ABSOLUTE" else name
    folder = write_bundle(tmp_path / "b", _with_bins("part1_of_2.bin", name))
    with pytest.raises(BundleError) as exc:
        read_bundle(folder)
    message = str(exc.value)
    assert message.startswith(f"{folder / CONFIG_FILE}: dialog.engine.model.binary.ctx-bins[1]: ")
    assert why in message and name[:40] in message.replace("\\\\", "\\") and "\n" not in message


def test_a_link_escaping_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "outside.json").write_text("{}")
    folder = write_bundle(tmp_path / "b")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(tmp_path / "outside.json")
    with pytest.raises(BundleError, match=r"dialog\.tokenizer\.path: 'tokenizer\.json' links outside the bundle"):
        read_bundle(folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(folder / "part1_of_2.bin")  # a link inside is a file inside
    assert read_bundle(folder).tokenizer == "tokenizer.json"


def test_an_extensions_config_and_any_other_string_are_held_to_the_folder(tmp_path: Path) -> None:
    config = genie_config()
    config["dialog"]["engine"]["backend"]["extensions"] = "../htp.json"
    with pytest.raises(BundleError, match=r"dialog\.engine\.backend\.extensions: '\.\./htp\.json'"):
        read_bundle(write_bundle(tmp_path / "a", config))
    config = genie_config()  # a field this reader does not know, which Genie might open all the same
    config["dialog"]["engine"]["backend"]["QnnHtp"]["cache-file"] = "/etc/passwd"
    with pytest.raises(BundleError, match=r"dialog\.engine\.backend\.QnnHtp\.cache-file: '/etc/passwd'"):
        read_bundle(write_bundle(tmp_path / "b", config))


@pytest.mark.parametrize(
    ("config", "why"),
    [(_with_bins(), r"dialog\.engine\.model\.binary\.ctx-bins: missing, empty"),
     (_with_bins("part1_of_2.bin", 7), r"dialog\.engine\.model\.binary\.ctx-bins: missing, empty, or not a list"),
     (genie_config(tokenizer={"version": 1}), r"dialog\.tokenizer\.path: missing"),
     (genie_config(engine={"version": 1}), r"dialog\.engine\.model: missing"),
     (genie_config(engine={"model": {"type": "library", "library": {"model-bin": "m.bin"}}}),
      r"dialog\.engine\.model\.type: 'library': only QNN context binaries"),
     ({"pipeline": {}}, r"dialog: missing, or not an object"),
     ([1, 2], r"expected a JSON object, found list")],
)  # fmt: skip
def test_a_config_without_what_genie_needs_is_refused_naming_the_field(tmp_path: Path, config: Any, why: str) -> None:
    folder = write_bundle(tmp_path / "b", config)
    with pytest.raises(BundleError, match=why) as exc:
        read_bundle(folder)
    assert str(exc.value).startswith(str(folder / CONFIG_FILE))


def test_a_config_that_is_not_json_is_refused(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "b")
    (folder / CONFIG_FILE).write_text('{"dialog": {"version": 1,')
    with pytest.raises(BundleError, match=rf"^{folder / CONFIG_FILE}: not JSON \(") as exc:
        read_bundle(folder)
    assert "\n" not in str(exc.value)


def test_a_100_mb_config_is_refused_without_being_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_bundle(tmp_path / "b")
    with open(folder / CONFIG_FILE, "wb") as f:
        f.truncate(100 << 20)  # sparse: made at once
    opened: list[Path] = []
    real_open = Path.open

    def spy(self: Path, *args: Any, **kwargs: Any) -> Any:
        opened.append(self)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", spy)
    t0 = time.perf_counter()
    with pytest.raises(BundleError, match=rf"{CONFIG_FILE}: 104857600 bytes, more than a Genie config's 4 MiB"):
        read_bundle(folder)
    assert time.perf_counter() - t0 < 1.0 and opened == []
    assert MAX_CONFIG_BYTES == 4 << 20


def test_a_config_that_is_no_regular_file_or_missing_is_refused(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "b")
    (folder / CONFIG_FILE).unlink()
    with pytest.raises(BundleError, match=r"genie_config\.json: missing"):
        read_bundle(folder)
    os.mkfifo(folder / CONFIG_FILE)  # reading it would block forever
    with pytest.raises(BundleError, match=r"genie_config\.json: not a regular file"):
        read_bundle(folder)


def test_the_store_imports_a_bundle_whole(tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "phi-genie-w4a16-x_elite", chat_template="{{ messages }}")
    store = ModelStore(tmp_path / "data", bundled=[])
    entry = store.import_local(folder, "test/bundle")
    assert (entry.id, entry.engine) == ("test/bundle:w4a16", "qairt")
    copied = read_bundle(Path(entry.path))
    assert copied.files == read_bundle(folder).files and copied.files[-1] == "tokenizer_config.json"
    assert entry.size == copied.total_bytes and store.entries() == [entry]


def test_the_store_refuses_a_bad_bundle_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "outside.bin").write_bytes(b"secret")
    folder = write_bundle(tmp_path / "b", _with_bins("../outside.bin"))
    store = ModelStore(tmp_path / "data", bundled=[])
    with pytest.raises(BadRequest, match=r"ctx-bins\[0\]: '\.\./outside\.bin' is not a relative path"):
        store.import_local(folder, "test/bundle")
    assert not (tmp_path / "data").exists() and store.entries() == []
