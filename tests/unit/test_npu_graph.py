"""The converter's pieces that need no model: Q/K row order, RoPE tables, refusals, cache keys."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from workers.engines.npu.convert import ConversionError, DecoderConfig, cache_key, read_config, unpermute_rope_rows
from workers.engines.npu.decoder import rope_tables


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to HF's Q/K weights (LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_undoes_llama_cpp_permutation() -> None:
    w = np.arange(3 * 8 * 5, dtype=np.float32).reshape(3 * 8, 5)
    assert np.array_equal(unpermute_rope_rows(llama_cpp_permute(w, 3), 3), w)
    assert not np.array_equal(llama_cpp_permute(w, 3), w)


def _cfg(**kw: object) -> DecoderConfig:
    base: dict[str, object] = {"arch": "llama", "n_layer": 1, "n_embd": 8, "n_head": 2, "n_head_kv": 1, "head_dim": 4,
                               "n_vocab": 10, "n_ctx_train": 64, "rms_eps": 1e-5, "rope_base": 10000.0,
                               "rope_linear_scale": 1.0, "rope_freq_factors": None, "source": "x"}  # fmt: skip
    base.update(kw)
    return DecoderConfig(**base)  # type: ignore[arg-type]


def test_rope_tables_are_rotate_half_angles() -> None:
    cos, sin = rope_tables(_cfg(), 3)
    assert cos.shape == sin.shape == (3, 4)
    assert np.allclose(cos[0], 1) and np.allclose(sin[0], 0)
    # halves repeat; frequency i is base^(-2i/d)
    assert np.allclose(cos[:, :2], cos[:, 2:])
    assert np.allclose(sin[2], np.sin([2.0, 2.0 / 100.0, 2.0, 2.0 / 100.0]), atol=1e-6)
    scaled, _ = rope_tables(_cfg(rope_linear_scale=2.0), 3)
    assert np.allclose(scaled[2], cos[1])


def _gguf(path: Path, arch: str) -> str:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_tensor("token_embd.weight", np.zeros((10, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_an_unsupported_architecture_is_refused_by_name(tmp_path: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(_gguf(tmp_path / "q.gguf", "gemma2"))
    with pytest.raises(ConversionError, match="'gemma2'"):
        read_config(reader, "q.gguf")
    cfg = read_config(gguf.GGUFReader(_gguf(tmp_path / "l.gguf", "llama")), "l.gguf")
    assert (cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_vocab) == (2, 1, 4, 10)


def test_the_cache_key_follows_the_file(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    first = cache_key(str(f))
    assert cache_key(str(f)) == first and first.startswith("m-")
    os.utime(f, ns=(1, 1))
    assert cache_key(str(f)) != first


def test_the_npu_chat_estimate_counts_the_4bit_weights_its_sessions_and_kv() -> None:
    from gateway.models.store import bundled_models
    from gateway.supervisor.memory import npu_chat_bytes
    from protocol.npu_plan import NPU_MAX_CTX

    entries = bundled_models()
    if not entries:
        pytest.skip("the bundled model is not installed")
    path = entries[0].path
    small, full = npu_chat_bytes(path, 128), npu_chat_bytes(path, NPU_MAX_CTX)
    # SmolLM2-135M: 98 MB of 4-bit weights (as converted), 967 MiB resident in the simulator with both sessions
    assert 0.95 * 967 * 2**20 < small < 1.4 * 967 * 2**20, small >> 20
    assert full - small == 4 * 30 * 2 * 192 * (NPU_MAX_CTX - 128)  # the fp32 KV buffer
    assert npu_chat_bytes(path, 8 * NPU_MAX_CTX) == full  # the engine caps its context


def test_npu_on_a_chat_gguf_needs_qnn_and_on_x86_the_simulator(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.supervisor import compute
    from protocol import qnn

    monkeypatch.setattr(qnn, "is_simulated", lambda: True)
    monkeypatch.setattr(qnn, "_installed", lambda: True)
    monkeypatch.delenv(qnn.SIMULATOR_ENV, raising=False)
    assert "no NPU" in (qnn.unavailable_reason() or "")
    assert compute.resolve_compute("npu", "llama_cpp") == "cpu"
    assert compute.resolve_compute("npu", "onnx") == "cpu"  # the embedding engine follows the same rule
    monkeypatch.setenv(qnn.SIMULATOR_ENV, "1")
    assert qnn.unavailable_reason() is None
    assert compute.resolve_compute("npu", "llama_cpp") == "npu"
    assert compute.resolve_compute("hybrid", "llama_cpp") == "hybrid"
    assert compute.resolve_compute("npu", "onnx") == "npu"
    assert compute.resolve_compute("npu", "llama_embed") == "cpu"  # an embedding GGUF has no NPU graph
    monkeypatch.setattr(qnn, "is_simulated", lambda: False)  # a Snapdragon
    monkeypatch.delenv(qnn.SIMULATOR_ENV)
    assert compute.resolve_compute("npu", "llama_cpp") == "npu"
