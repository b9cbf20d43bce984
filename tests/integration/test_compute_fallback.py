"""A request that allows no fallback (`geniex serve --no-compute-fallback`, or one request's
`GenieX-Compute-Fallback: false`) runs on the `compute` unit it asked for or gets a 400 with the
reason, never the CPU instead: an NPU model too large for the SoC is refused before anything is
converted or compiled, naming its size and the limit; a build without GPU offload names that."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import llama_cpp
import pytest

from gateway.models.store import OCR_MODEL_ID
from tests.conftest import MODEL
from tests.server_proc import ServerProcess, serving
from tests.unit.test_npu_plan import LLAMA_8B, _header_only_gguf

BIG = "test/llama-8b-shape"
HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("strict")
    gguf = _header_only_gguf(tmp_path_factory.mktemp("big") / "llama-8b-shape.gguf", LLAMA_8B)
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "pull", BIG, "--local", str(gguf), "--data-dir",
                           str(data)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with serving(data, "--qnn-simulator", "--no-compute-fallback", "--nctx", "512") as srv:
        yield srv


def _chat(
    server: ServerProcess, model: str, compute: str | None, headers: dict[str, str] | None = None
) -> httpx.Response:
    body = {"model": model, "messages": HI, "max_tokens": 2, "temperature": 0,
            **({"compute": compute} if compute else {})}  # fmt: skip
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def _workers(server: ServerProcess) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = httpx.get(f"{server.base_url}/v1/workers").json()["data"]
    return rows


def test_an_npu_model_too_large_for_the_soc_is_a_400_naming_its_size_and_the_limit(server: ServerProcess) -> None:
    r = _chat(server, BIG, "npu")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if importlib.util.find_spec("onnxruntime_qnn") is None:
        assert "onnxruntime-qnn" in error
    else:
        assert "does not fit this NPU" in error and "at nctx 512" in error, error  # the server's --nctx
        assert "9.45 GB of NPU memory" in error and "4.00 GB one process may use on the Snapdragon X" in error, error
    assert not [w for w in _workers(server) if str(w["model"]).startswith(BIG)]  # refused before any load


@pytest.mark.skipif(llama_cpp.llama_supports_gpu_offload(), reason="this llama.cpp build offloads to a GPU")
def test_a_build_without_gpu_offload_is_a_400_unless_the_request_allows_the_cpu(server: ServerProcess) -> None:
    for _ in range(2):  # the first learns it from the worker's Ready, the second before any load
        r = _chat(server, MODEL, "gpu")
        assert r.status_code == 400 and "no GPU offload" in r.json()["error"], r.text
    allowed = _chat(server, MODEL, "gpu", {"GenieX-Compute-Fallback": "true"})
    assert allowed.status_code == 200 and allowed.json()["choices"][0]["message"]["content"], allowed.text
    assert _chat(server, MODEL, None).status_code == 200  # no unit asked for: nothing to refuse
    assert _chat(server, MODEL, "cpu", {"GenieX-Compute-Fallback": "false"}).status_code == 200


def test_a_fallback_server_refuses_only_the_request_that_asks(tmp_path: Path) -> None:
    """The per-request header alone, on a server that falls back by default."""
    with serving(tmp_path / "data") as srv:
        r = _chat(srv, MODEL, "npu", {"GenieX-Compute-Fallback": "false"})
        assert r.status_code == 400 and "`compute`: npu is not available" in r.json()["error"], r.text
        assert _chat(srv, MODEL, "npu").status_code == 200  # falls back to the CPU, as before


def test_a_unit_the_models_engine_has_no_path_for_is_a_400_naming_the_engine(server: ServerProcess) -> None:
    """OCR runs on the CPU or the NPU; a GPU asked for it, with no fallback allowed, says so."""
    import base64
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (32, 32), "white").save(png, format="PNG")
    body = {"model": OCR_MODEL_ID, "image": base64.b64encode(png.getvalue()).decode(), "compute": "gpu"}
    r = httpx.post(f"{server.base_url}/v1/cv", json=body, timeout=60)
    assert r.status_code == 400 and "engine ocr has no gpu support" in r.json()["error"], r.text
