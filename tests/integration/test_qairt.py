"""Genie bundles (engine qairt) through the real server and `geniex pull`, on this x86_64 machine
without an NPU: a hostile bundle is refused by the pull with the file and the reason, and nothing
is written; a valid-looking one (its context binaries are dummies: no bundle Genie can run is made
here) imports and lists as a chat model of engine qairt; asking it to chat answers a clear 503 or
400 naming why it cannot run here, never a 500 or a hang; and the server keeps serving the default
model throughout."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from protocol.genie_bundle import CONFIG_FILE
from tests.conftest import MODEL
from tests.genie_bundles import genie_config, write_bundle
from tests.server_proc import ServerProcess, serving

pytestmark = pytest.mark.timeout(300)

BUNDLE = "test/bundle"
HI = [{"role": "user", "content": "hi"}]


def _pull(data: Path, name: str, folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "pull", name, "--local", str(folder), "--data-dir",
                           str(data)], capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qairt-data")


@pytest.fixture(scope="module")
def server(data: Path) -> Iterator[ServerProcess]:
    with serving(data, "--nctx", "512") as srv:
        yield srv


def _chat(server: ServerProcess, model: str, **extra: object) -> httpx.Response:
    headers = extra.pop("headers", None)
    body = {"model": model, "messages": HI, "max_tokens": 2, "temperature": 0, **extra}
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)  # type: ignore[arg-type]


def _still_serving(server: ServerProcess) -> None:
    r = _chat(server, MODEL)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None, r.text


def test_a_hostile_bundle_is_refused_by_the_pull_and_nothing_is_written(server: ServerProcess, data: Path,
                                                                         tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "secret.bin").write_bytes(b"not the bundle's")
    config = genie_config()
    config["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = ["part1_of_2.bin", "../secret.bin"]
    folder = write_bundle(tmp_path / "hostile", config)
    done = _pull(data, "test/hostile", folder)
    assert done.returncode != 0 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert lines == [f"error: {folder / CONFIG_FILE}: dialog.engine.model.binary.ctx-bins[1]: '../secret.bin' is not "
                     "a relative path inside the bundle"]  # fmt: skip
    assert not list(data.rglob("manifest.json")) and not list(data.glob("models/.partial/*"))
    listed = [m["id"] for m in httpx.get(f"{server.base_url}/v1/models").json()["data"]]
    assert not [m for m in listed if m.startswith("test/hostile")]
    _still_serving(server)


def test_a_missing_context_binary_is_refused_naming_it(server: ServerProcess, data: Path, tmp_path: Path) -> None:
    folder = write_bundle(tmp_path / "broken")
    (folder / "part2_of_2.bin").unlink()
    done = _pull(data, "test/broken", folder)
    assert done.returncode != 0
    assert "ctx-bins[1]: 'part2_of_2.bin' does not exist in the bundle" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def imported(server: ServerProcess, data: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = write_bundle(tmp_path_factory.mktemp("genie") / "tiny-genie-w4a16-qualcomm_snapdragon_x_elite")
    done = _pull(data, BUNDLE, folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"{BUNDLE}:w4a16"
    return done.stdout.strip()


def test_a_bundle_imports_and_lists_as_a_qairt_chat_model(server: ServerProcess, imported: str) -> None:
    models = {m["id"]: m for m in httpx.get(f"{server.base_url}/v1/models").json()["data"]}
    row = models[imported]
    assert row["engine"] == "qairt" and row["quantization"] == "w4a16"
    assert row["capabilities"] == ["chat", "completion", "tools"]
    assert MODEL in models


def test_chat_on_a_bundle_without_an_npu_is_a_clear_refusal_and_the_server_goes_on(server: ServerProcess,
                                                                                    imported: str) -> None:  # fmt: skip
    r = _chat(server, imported, compute="npu")
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert "Genie bundles run only on a Snapdragon NPU" in error and "has no NPU" in error, error
    # Streamed, it is the same plain refusal before any event: the worker says no before it starts.
    r = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120,
                   json={"model": imported, "messages": HI, "max_tokens": 2, "stream": True})  # fmt: skip
    assert r.status_code == 503 and "Snapdragon NPU" in r.json()["error"], r.text
    # A request that allows no fallback is refused up front, naming the unit and why.
    r = _chat(server, imported, compute="npu", headers={"GenieX-Compute-Fallback": "false"})
    assert r.status_code == 400 and "`compute`: npu is not available for this model" in r.json()["error"], r.text
    worker = next(w for w in httpx.get(f"{server.base_url}/v1/workers").json()["data"] if w["model"] == imported)
    assert worker["engine"] == "qairt" and "Snapdragon NPU" in (worker.get("fallback") or ""), worker
    assert worker["doctor_check"] == "npu.soc", worker  # `geniex doctor`'s check of an NPU-less host
    _still_serving(server)
