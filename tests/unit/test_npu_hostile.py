"""Hostile GGUFs for the NPU chat worker: a file whose tensors disagree with its header, a tensor of
an unknown quantization type, a truncated file. Each is a ConversionError naming the file and the
reason before the converter reads a tensor, nothing is written to the NPU cache, and the worker's
error says it (workers/engines/npu/gguf_checks.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.npu_models import TinyGGUF, bundled_gguf
from workers.engines.npu.convert import ConversionError
from workers.engines.npu.gguf_checks import check_gguf


def _tiny(path: Path, header_width: int = 64) -> Path:
    """A random 2-layer llama of width 64 whose header may claim another width."""
    n_embd, n_ff, n_vocab = 64, 96, 256
    g = TinyGGUF(path, "llama", n_layer=2, n_embd=header_width, n_ff=n_ff, n_head=4, n_kv=2, tokenizer=False)
    t = g.tensor
    t("token_embd.weight", n_vocab, n_embd)
    t("output_norm.weight", n_embd)
    for i in range(2):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", n_embd)
        t(p + "ffn_norm.weight", n_embd)
        for name, rows in (("attn_q", n_embd), ("attn_k", 32), ("attn_v", 32), ("attn_output", n_embd)):
            t(p + name + ".weight", rows, n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    g.write()
    return path


def _with_type(src: Path, out: Path, tensor: str, ggml_type: int) -> Path:
    data = bytearray(src.read_bytes())
    key = tensor.encode()
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    (n_dims,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, ggml_type)
    out.write_bytes(bytes(data))
    return out


def test_real_and_well_formed_files_pass(tmp_path: Path) -> None:
    check_gguf(bundled_gguf())
    check_gguf(str(_tiny(tmp_path / "ok.gguf")))


def test_hostile_files_are_refused_naming_the_file_and_the_reason(tmp_path: Path) -> None:
    ok = _tiny(tmp_path / "ok.gguf")
    data = ok.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    (tmp_path / "stub.gguf").write_bytes(data[:20])
    cases = {
        _tiny(tmp_path / "wide.gguf", header_width=128): "token_embd.weight is 64 x 256, which disagrees with the header",
        _with_type(ok, tmp_path / "q99.gguf", "blk.0.attn_q.weight", 99): "blk.0.attn_q.weight has an unknown quantization type (99)",
        tmp_path / "cut.gguf": "the file is truncated: tensor blk.",
        tmp_path / "stub.gguf": "not a readable GGUF",
    }  # fmt: skip
    for path, reason in cases.items():
        with pytest.raises(ConversionError) as refused:
            check_gguf(str(path))
        assert str(path) in str(refused.value) and reason in str(refused.value), refused.value


def test_the_npu_worker_refuses_a_hostile_file_before_converting_and_says_why(tmp_path: Path) -> None:
    """On the CPU EP path (no QNN needed): the engine's own load refuses it, and nothing is cached."""
    from protocol.worker_args import WorkerArgs
    from workers.engines import EngineError
    from workers.engines.npu.engine import CpuFallback, NpuChatEngine, NpuUnavailable

    ok = _tiny(tmp_path / "ok.gguf")
    data = ok.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    opts = WorkerArgs(engine="llama_npu", model_path=str(tmp_path / "cut.gguf"), compute="npu", nctx=64,
                      cache_dir=str(tmp_path / "cache"))  # fmt: skip
    with pytest.raises(NpuUnavailable, match=r"cut\.gguf: the file is truncated"):
        NpuChatEngine(opts, cpu_threads=1)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    # The CPU engine cannot load it either: the worker's error gives both reasons.
    with pytest.raises(EngineError, match=r"the NPU refused it too: .*the file is truncated"):
        CpuFallback(opts, "the file is truncated")
