"""`python -m workers.doctor {llama,gpu-run} --model GGUF` | `python -m workers.doctor qnn`: the doctor's checks
that need an engine, one probe per process, its checks as JSON on stdout (protocol/doctor.py).

Each runs in a process of its own because it may not return: llama.cpp's Vulkan driver or QNN's
FastRPC round-trip to the cDSP can hang at their first call on some laptops, and the gateway's
doctor kills a probe at its bound and reports the hang instead of waiting for it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from protocol import qnn
from protocol.doctor import Check

PROMPT = "1, 2, 3,"
TOKENS = 4
ALL_LAYERS = 999  # the spec's "every layer"


def _generate(model_path: str, n_gpu_layers: int) -> tuple[str, float, int, int]:
    """(text, seconds, layers offloaded, layers in all) of a short greedy generation."""
    import llama_cpp

    from workers.engines.llama_runtime import offloaded_layers

    llm = llama_cpp.Llama(model_path, n_ctx=256, n_gpu_layers=n_gpu_layers, verbose=False, seed=0)
    try:
        t0 = time.perf_counter()
        out: Any = llm(PROMPT, max_tokens=TOKENS, temperature=0.0)
        seconds = time.perf_counter() - t0
        on, total = offloaded_layers(llm.model, n_gpu_layers)  # type: ignore[arg-type]  # a llama_model_p is a c_void_p
        return str(out["choices"][0]["text"]), seconds, on, total
    finally:
        llm.close()


def llama_checks(model_path: str) -> list[Check]:
    import llama_cpp

    from workers.engines.llama_runtime import backend_names, cpu_features, devices

    found = devices()
    accelerated = [b for b in backend_names() if b not in ("CPU", "BLAS", "RPC")]
    version = getattr(llama_cpp, "__version__", "?")
    checks = [
        Check("cpu.build", "ok", f"llama-cpp-python {version}; CPU features: {cpu_features() or 'none reported'}")
    ]
    checks.append(_run("cpu.run", lambda: _generate(model_path, 0)))
    gpus = [d for d in found if d.kind in ("gpu", "igpu")]
    listed = ", ".join(f"{d.name} ({d.description}, {d.kind}, {d.memory_total >> 20} MiB)" for d in gpus)
    if gpus:
        checks.append(Check("gpu.backends", "ok", f"llama.cpp sees {listed}"))
    elif not accelerated:
        checks.append(Check("gpu.backends", "fail", "this llama.cpp build has no GPU backend (built for the CPU alone)",
                            "make install GPU=vulkan (or opencl); `make devices` lists what a build sees "
                            "(docs/accelerators.md#gpu)"))  # fmt: skip
    else:
        hidden = (
            ""
            if os.environ.get("GGML_VK_VISIBLE_DEVICES")
            else (
                "; llama.cpp skips a Vulkan driver that runs on the CPU (lavapipe) unless GGML_VK_VISIBLE_DEVICES names it"
            )
        )
        checks.append(Check("gpu.backends", "fail", f"this build's {', '.join(accelerated)} backend sees no GPU device{hidden}",
                            "check the GPU's driver (vulkaninfo --summary, clinfo) and the render node's permissions"))  # fmt: skip
    htp = [d.name for d in found if d.name.upper().startswith("HTP")]
    checks.append(Check("npu.llama_htp", "ok", f"llama.cpp's Hexagon backend sees {', '.join(htp)}") if htp else Check(
        "npu.llama_htp", "skip", "this llama.cpp build has no Hexagon backend (optional: GGUF chat on the NPU goes "
        "through onnxruntime-qnn instead)"))  # fmt: skip
    return checks


def gpu_run_checks(model_path: str) -> list[Check]:
    """Apart from llama_checks: a GPU driver that hangs is then the only thing this process loses."""
    return [_run("gpu.offload_run", lambda: _generate(model_path, ALL_LAYERS), offload=True)]


def _run(name: str, generate: Callable[[], tuple[str, float, int, int]], offload: bool = False) -> Check:
    try:
        text, seconds, on, total = generate()
    except Exception as exc:  # noqa: BLE001 - the probe's whole point is to say what broke
        return Check(name, "fail", f"{type(exc).__name__}: {exc}", "the log above, or `make devices`")
    where = f"; {on} of {total} layers offloaded" if offload else ""
    if offload and on == 0:
        return Check(name, "fail", f"the model loaded but no layer was offloaded{where}")
    return Check(name, "ok", f"{TOKENS} tokens in {seconds:.2f} s ({text.strip()!r}){where}")


def qnn_checks() -> list[Check]:
    """A graph of one Add, on the HTP alone (CPU fallback off, so nothing can quietly run elsewhere)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from workers.engines.onnx import QNN, npu_devices, qnn_options

    devices, why = npu_devices()
    if why is not None:
        return [Check("npu.htp_run", "fail", why, _fix_for(why))]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "doctor", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(devices[:1], qnn_options("auto"))
    t0 = time.perf_counter()
    try:
        session = ort.InferenceSession(model.SerializeToString(), sess_options=so)
        feed = np.arange(8, dtype=np.float32).reshape(1, 8)
        out = session.run(None, {"x": feed})[0]
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors have no common type but this
        return [Check("npu.htp_run", "fail", f"QNN could not run a 1-op graph: {type(exc).__name__}: {exc}",
                      "geniex doctor's npu.* checks above; the worker log with GENIEX_LOG_LEVEL=debug")]  # fmt: skip
    seconds = time.perf_counter() - t0
    if QNN not in session.get_providers() or not np.allclose(out, feed * 2, atol=1e-2):
        return [
            Check("npu.htp_run", "fail", f"the 1-op graph ran on {session.get_providers()} and returned {out.tolist()}")
        ]
    where = "Qualcomm's HTP simulator" if qnn.is_simulated() else "the HTP"
    return [
        Check("npu.htp_run", "ok", f"a 1-op graph ran on {where} in {seconds:.2f} s (session and run), result exact")
    ]


def _fix_for(why: str) -> str:
    if "not installed" in why:
        return "pip install onnxruntime-qnn (installed by `make install` on Linux aarch64, Windows ARM64 and x86_64)"
    if "simulator" in why:
        return f"for development only: {qnn.SIMULATOR_ENV}=1 geniex doctor"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.doctor")
    sub = parser.add_subparsers(dest="probe", required=True)
    for name in ("llama", "gpu-run"):
        sub.add_parser(name).add_argument("--model", required=True)
    sub.add_parser("qnn")
    args = parser.parse_args(argv)
    probes = {
        "llama": lambda: llama_checks(args.model),
        "gpu-run": lambda: gpu_run_checks(args.model),
        "qnn": qnn_checks,
    }
    checks = probes[args.probe]()
    sys.stdout.write(msgspec.json.encode(checks).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
