"""Which compute unit a request gets: the gateway learns whether an engine's build offloads to a
GPU from its workers' Ready (it imports no engine), and a worker asked for a GPU its build lacks
runs on the CPU and says why."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
import zmq.asyncio

from gateway.models.store import ModelEntry
from gateway.ops.metrics import Metrics
from gateway.ops.settings import Settings
from gateway.supervisor import compute
from gateway.supervisor.pool import WorkerPool
from protocol.wire import Device, Ready
from protocol.worker_args import WorkerArgs


@pytest.fixture(autouse=True)
def nothing_learned(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(compute, "_gpu_offload", {})
    monkeypatch.setattr(compute, "_devices", {})
    compute._warn_once.cache_clear()
    yield
    compute._warn_once.cache_clear()


def said(engine: str, gpu_offload: bool) -> None:
    compute.learn(engine, Ready(protocol_version=1, pid=1, engine=engine, compute="cpu", n_ctx=8,
                                gpu_offload=gpu_offload))  # fmt: skip


def test_gpu_is_asked_for_until_a_worker_says_its_build_cannot() -> None:
    assert compute.gpu_offload("llama_cpp") is None
    assert compute.resolve_compute("gpu", "llama_cpp") == "gpu"  # unknown: the worker falls back itself
    said("llama_cpp", True)
    assert compute.resolve_compute("gpu", "llama_cpp") == "gpu"
    assert compute.resolve_compute("GPU", "llama_cpp") == "gpu"
    said("llama_cpp", False)
    with structlog.testing.capture_logs() as logs:
        assert compute.resolve_compute("gpu", "llama_cpp") == "cpu"
    assert [e["reason"] for e in logs] == ["this llama.cpp build has no GPU offload"]
    assert compute.resolve_compute("gpu", "llama_embed") == "gpu", "each engine's own workers say it"
    assert compute.resolve_compute("gpu", "onnx") == "cpu"  # an engine without a GPU path, whatever was said
    assert compute.resolve_compute(None, "llama_cpp") == "cpu"


def test_hybrid_without_qnn_takes_the_gpu_unless_the_build_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from protocol import qnn

    monkeypatch.setattr(qnn, "unavailable_reason", lambda: "no NPU here")
    assert compute.resolve_compute("hybrid", "llama_cpp") == "gpu"
    assert compute.resolve_compute("hybrid", "llama_embed") == "gpu"  # no NPU path: hybrid is its GPU
    said("llama_cpp", False)
    said("llama_embed", False)
    assert compute.resolve_compute("hybrid", "llama_cpp") == "cpu"
    assert compute.resolve_compute("hybrid", "llama_embed") == "cpu"


CPU = Device("CPU", "cpu", "AMD EPYC")
VULKAN = Device("Vulkan0", "gpu", "llvmpipe (LLVM 15.0.6, 256 bits)", 8 << 30, 8 << 30)
HTP = Device("HTP0", "accel", "Hexagon V73", 4 << 30, 4 << 30)


def test_each_compute_value_gets_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """cpu: the CPU; gpu: the GPU while the build has one; npu on a GGUF: llama.cpp's own Hexagon
    device once a worker has reported one, else the ONNX/QNN engine (or the CPU without QNN)."""
    from gateway.supervisor.memory import worker_engine
    from protocol import qnn

    monkeypatch.setattr(qnn, "unavailable_reason", lambda: None)
    gguf = ModelEntry(id="t/m:Q4_0", org="t", repo="m", precision="Q4_0", engine="llama_cpp", path="/m.gguf", size=1,
                      created=0)  # fmt: skip
    assert compute.choose("cpu", "llama_cpp") == ("cpu", None)
    assert compute.choose("npu", "llama_cpp") == ("npu", None)
    assert worker_engine(gguf, "npu") == "llama_npu"  # no HTP device known: the QNN conversion
    compute.learn("llama_cpp", Ready(protocol_version=1, pid=1, engine="llama_cpp", compute="cpu", n_ctx=8,
                                     gpu_offload=True, devices=[CPU, VULKAN, HTP]))  # fmt: skip
    assert compute.devices("llama_cpp") == [CPU, VULKAN, HTP] and compute.has_htp("llama_cpp")
    assert compute.choose("gpu", "llama_cpp") == ("gpu", None)
    assert compute.choose("npu", "llama_cpp") == ("npu", None)
    assert worker_engine(gguf, "npu") == "llama_cpp"  # llama.cpp runs the GGUF on HTP itself
    assert worker_engine(gguf, "hybrid") == "llama_npu"
    monkeypatch.setattr(qnn, "unavailable_reason", lambda: "no NPU here")
    assert compute.choose("npu", "llama_cpp") == ("npu", None)  # HTP needs no onnxruntime-qnn
    assert compute.choose("npu", "onnx") == ("cpu", "no NPU here")
    compute.learn("llama_cpp", Ready(protocol_version=1, pid=1, engine="llama_cpp", compute="cpu", n_ctx=8,
                                     devices=[CPU]))  # fmt: skip
    assert compute.choose("gpu", "llama_cpp") == ("cpu", "this llama.cpp build has no GPU offload")
    assert compute.choose("npu", "llama_cpp") == ("cpu", "no NPU here")
    assert compute.choose("gpu", "whisper") == ("cpu", "engine whisper has no gpu support here")


def test_the_gateway_imports_no_engine() -> None:
    code = (
        "import sys, gateway.app, gateway.supervisor.pool\n"
        "from gateway.supervisor.compute import resolve_compute\n"
        "for engine in ('llama_cpp', 'llama_embed', 'onnx'):\n"
        "    resolve_compute('gpu', engine)\n"  # once, this asked llama.cpp itself
        "print(sorted(m for m in ('llama_cpp', 'onnxruntime', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.splitlines()[-1] == "[]"  # after the fallback warnings


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[WorkerPool]:
    p = WorkerPool(Settings(data_dir=tmp_path), zmq.asyncio.Context(), Metrics(process=False))
    p.start()
    yield p
    await p.close()
    p.zctx.destroy(linger=0)


@pytest.mark.parametrize("offloads", [True, False])
async def test_the_gateway_learns_gpu_offload_from_a_workers_ready(
    pool: WorkerPool, tmp_path: Path, offloads: bool
) -> None:
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"gpu_offload": offloads}))
    entry = ModelEntry(id="test/f:F", org="test", repo="f", precision="F", engine="fake", path=str(path), size=1,
                       created=0)  # fmt: skip
    handle = await pool.get(pool.key_for(entry, None, None, None), entry, claim=False)
    assert handle.ready_info is not None and handle.ready_info.gpu_offload is offloads
    assert compute.gpu_offload("fake") is offloads


# ---- the worker's side: llama.cpp -------------------------------------------------


def test_a_llama_worker_asked_for_a_gpu_its_build_lacks_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.engines import llama_runtime

    assert llama_runtime.runs_on("cpu") == ("cpu", "")
    monkeypatch.setattr(llama_runtime, "gpu_offload", lambda: True)
    assert llama_runtime.runs_on("gpu") == ("gpu", "")
    monkeypatch.setattr(llama_runtime, "gpu_offload", lambda: False)
    assert llama_runtime.runs_on("gpu") == ("cpu", "this llama.cpp build has no GPU offload")
    assert llama_runtime.gpu_layers("cpu", -1) == 0  # so no layer is offloaded


def test_a_llama_workers_ready_says_what_its_build_can_do() -> None:
    """The bundled model loaded as the worker would on `compute: gpu` (a second to load)."""
    from gateway.models.store import bundled_models
    from workers.engines import llama_runtime
    from workers.engines.llama.engine import LlamaEngine

    entries = bundled_models()
    if not entries:
        pytest.skip("the bundled model is not installed")
    # The worker's own arguments, so that every option an engine reads has its default.
    opts = WorkerArgs(engine="llama_cpp", model_path=entries[0].path, compute="gpu", ngl=-1, nctx=256, parallel=1,
                      threads=1)  # fmt: skip
    engine = LlamaEngine(opts)
    try:
        r = engine.ready()
    finally:
        engine.close()
    assert r.gpu_offload is llama_runtime.gpu_offload()
    assert any(d.name == "CPU" and d.kind == "cpu" for d in r.devices), r.devices
    if r.gpu_offload:
        assert (r.compute, r.fallback) == ("gpu", "")
    else:
        assert (r.compute, r.fallback) == ("cpu", "this llama.cpp build has no GPU offload")
        assert engine.n_gpu_layers == 0
