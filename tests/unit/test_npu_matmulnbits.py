"""GGUF weight blocks as onnxruntime's MatMulNBits: Q4_0 and Q8_0 repacked bit for bit (a one-node
graph on the CPU EP computes x @ dequantize(W).T to fp32 rounding), other types quantized again as
ggml's quantize_row_q4_0 / q8_0 do, and the op whole on QNN's HTP (simulator) with no CPU fallback."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType, quants
from onnx import TensorProto, helper, numpy_helper

from workers.engines.npu.convert import describe_quantization, unpermute_rope_rows, weight_blocks

N, K = 96, 256
rng = np.random.default_rng(0)
W = rng.standard_normal((N, K)).astype(np.float32)
X = rng.standard_normal((1, 3, K)).astype(np.float32)


def gguf_tensor(w: np.ndarray, qtype: GGMLQuantizationType) -> Any:
    """What GGUFReader gives for a [N, K] weight of `qtype`: ggml's shape (K, N), the raw rows."""
    data = w.copy() if qtype == GGMLQuantizationType.F32 else quants.quantize(w, qtype)
    return SimpleNamespace(tensor_type=qtype, shape=[w.shape[1], w.shape[0]], data=data)


def one_node(blocks: tuple[int, np.ndarray, np.ndarray | None, str]) -> bytes:
    bits, b, scales, _how = blocks
    assert scales is not None and b.shape == (N, K // 32, 32 * bits // 8) and scales.shape == (N * K // 32,)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft", K=K, N=N, bits=bits,
                            block_size=32)  # fmt: skip
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 3, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 3, N])],
                              [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")])  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    return model.SerializeToString()


def run_cpu(blocks: tuple[int, np.ndarray, np.ndarray | None, str]) -> np.ndarray:
    session = ort.InferenceSession(one_node(blocks), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"A": X})[0])


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize(("qtype", "bits"), [(GGMLQuantizationType.Q4_0, 4), (GGMLQuantizationType.Q8_0, 8)])
def test_q4_0_and_q8_0_are_repacked_exactly(qtype: GGMLQuantizationType, bits: int) -> None:
    t = gguf_tensor(W, qtype)
    want = X.astype(np.float64) @ quants.dequantize(t.data, qtype).astype(np.float64).T
    blocks = weight_blocks(t)
    assert blocks[0] == bits and blocks[3] == f"{qtype.name.lower()} exact"
    assert rel_err(run_cpu(blocks), want) < 2e-6  # fp32 rounding, nothing more: the same codes and scales
    # Q/K rows reordered for RoPE and the attention scale folded in, on the blocks themselves.
    heads = 3
    moved = weight_blocks(t, lambda rows: unpermute_rope_rows(rows, heads), factor=0.125)
    deq = unpermute_rope_rows(quants.dequantize(t.data, qtype).astype(np.float64), heads) * 0.125
    assert rel_err(run_cpu(moved), X.astype(np.float64) @ deq.T) < 2e-6


@pytest.mark.parametrize(("qtype", "how"), [(GGMLQuantizationType.Q4_1, "requantized q4_1→4-bit"),
                                            (GGMLQuantizationType.F32, "requantized f32→4-bit")])  # fmt: skip
def test_other_types_are_quantized_again_as_ggml_q4_0(qtype: GGMLQuantizationType, how: str) -> None:
    t = gguf_tensor(W, qtype)
    blocks = weight_blocks(t)
    assert blocks[0] == 4 and blocks[3] == how
    w = t.data if qtype == GGMLQuantizationType.F32 else quants.dequantize(t.data, qtype)
    q4 = quants.dequantize(quants.quantize(w.astype(np.float32), GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0)
    assert rel_err(run_cpu(blocks), X.astype(np.float64) @ q4.astype(np.float64).T) < 2e-6
    assert rel_err(run_cpu(blocks), X @ W.T) < 0.2  # and near the original (Q4_1 then Q4_0: twice rounded)


def test_the_quantization_is_described_by_count() -> None:
    hows = ["q4_0 exact"] * 3 + ["requantized q6_k→8-bit"]
    assert describe_quantization(hows) == "q4_0 exact (3 tensors), requantized q6_k→8-bit (1)"


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_qnn") is None, reason="needs onnxruntime-qnn")
@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q8_0])
def test_matmulnbits_runs_whole_on_qnn_htp(qtype: GGMLQuantizationType, tmp_path: Path) -> None:
    """bits 4 and 8, block 32, no zero-point input: on QNN's HTP (the simulator on x86_64) with
    onnxruntime's CPU fallback disabled, every node on QNN, fp16 close to the CPU's answer."""
    from workers.engines.onnx import nodes_by_provider, qnn_options, register_qnn

    devices = register_qnn()
    t = gguf_tensor(W, qtype)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(devices[:1], qnn_options())
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(one_node(weight_blocks(t)), sess_options=so)
    got = np.asarray(session.run(None, {"A": X})[0])
    assert nodes_by_provider(session.end_profiling()) == {"QNNExecutionProvider": 1}
    assert rel_err(got, X @ quants.dequantize(t.data, qtype).T) < 5e-3  # fp16 on the HTP


def test_a_float_width_that_is_no_multiple_of_32_stays_a_float_matmul() -> None:
    w = W[:, :40]
    bits, b, scales, how = weight_blocks(gguf_tensor(w, GGMLQuantizationType.F32))
    assert (bits, scales, how) == (0, None, "f32 float") and np.array_equal(b, w.T)
