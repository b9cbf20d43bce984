"""The converter's other architectures, each on a small random model of its family's shape: written
with `gguf`, quantized to Q8_0 by llama.cpp's quantizer, converted, and the graph's logits (the
onnxruntime CPU EP) against llama.cpp's on an F32 copy of that same file (the same weights, so only
fp32 rounding separates them), as test_npu_convert.test_a_qwen2_model_converts_exactly does for qwen2.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp as L
import numpy as np
import pytest

from tests.npu_models import TinyGGUF, quantize
from workers.engines.npu.convert import SUPPORTED_ARCHS, ConversionError, convert
from workers.engines.npu.decoder import Decoder, cpu_session_factory

PROMPT = b"The capital of France is Paris, and the capital of Italy is"
N_CTX = 64
CHUNK = 8
N_VOCAB, N_EMBD, N_HEAD, N_KV, N_FF, N_LAYER = 49152, 64, 4, 2, 96, 2


def random_gguf(path: Path, arch: str, *, head_dim: int = N_EMBD // N_HEAD, tied: bool = False,
                extra: tuple[str, ...] = ()) -> str:  # fmt: skip
    """A random 2-layer model of `arch` with the bundled model's tokenizer (llama.cpp needs one).
    qwen3: separate Q/K/V without biases, per-head Q/K RMSNorm weights, `head_dim` (its
    `key_length`) free of n_embd / n_head as in Qwen3-0.6B; phi3: the fused `attn_qkv` (Q's rows,
    K's, V's) and the fused `ffn_up` (the gate's rows, then the up rows), no `ffn_gate`. `extra`
    tensors (a name each) are added as [head_dim / 2] vectors of ones."""
    q_dim, kv_dim = N_HEAD * head_dim, N_KV * head_dim
    g = TinyGGUF(path, arch, n_layer=N_LAYER, n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_kv=N_KV, seed=1)
    w, t = g.w, g.tensor
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(1000000.0 if arch == "qwen3" else 10000.0)
    w.add_layer_norm_rms_eps(1e-6 if arch == "qwen3" else 1e-5)

    t("token_embd.weight", N_VOCAB, N_EMBD, scale=1.0)
    t("output_norm.weight", N_EMBD, scale=0.1, base=1.0)
    if not tied:
        t("output.weight", N_VOCAB, N_EMBD)
    for name in extra:
        w.add_tensor(name, np.ones(head_dim // 2, np.float32))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", N_EMBD, scale=0.1, base=1.0)
        t(p + "ffn_norm.weight", N_EMBD, scale=0.1, base=1.0)
        if arch == "phi3":
            t(p + "attn_qkv.weight", q_dim + 2 * kv_dim, N_EMBD)
            t(p + "ffn_up.weight", 2 * N_FF, N_EMBD)
        else:
            t(p + "attn_q.weight", q_dim, N_EMBD)
            t(p + "attn_k.weight", kv_dim, N_EMBD)
            t(p + "attn_v.weight", kv_dim, N_EMBD)
            t(p + "attn_q_norm.weight", head_dim, scale=0.1, base=1.0)
            t(p + "attn_k_norm.weight", head_dim, scale=0.1, base=1.0)
            t(p + "ffn_gate.weight", N_FF, N_EMBD)
            t(p + "ffn_up.weight", N_FF, N_EMBD)
        t(p + "attn_output.weight", N_EMBD, q_dim)
        t(p + "ffn_down.weight", N_EMBD, N_FF)
    return g.write()


def max_logit_difference(path: str, folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[float, float]:
    """(the largest |graph - llama.cpp| over the prompt's last positions, the largest |logit|): a
    chunked prefill of 5 tokens, then a token per step, against llama.cpp on the file's F32 copy."""
    from workers.engines.npu.convert import DecoderConfig

    llm = L.Llama(path, n_ctx=N_CTX, verbose=False, vocab_only=True)
    tokens = llm.tokenize(PROMPT, add_bos=False)
    ref_llm = L.Llama(quantize(path, "f32", tmp_path_factory), n_ctx=N_CTX, logits_all=True, verbose=False,
                      type_k=L.GGML_TYPE_F32, type_v=L.GGML_TYPE_F32)  # fmt: skip
    ref_llm.eval(tokens)
    ref = np.array(ref_llm.scores[: len(tokens)])
    dec = Decoder(folder, DecoderConfig.load(folder), N_CTX, cpu_session_factory(2), chunk=CHUNK)
    got = [dec.prefill(tokens[:5])] + [dec.decode(t) for t in tokens[5:]]
    diff = max(float(np.abs(g - r).max()) for g, r in zip(got, ref[4:], strict=True))
    return diff, float(np.abs(ref).max())


@pytest.mark.parametrize(
    ("arch", "head_dim", "tied"),
    [("qwen3", 32, False), ("qwen3", N_EMBD // N_HEAD, True), ("phi3", N_EMBD // N_HEAD, False)],
    ids=["qwen3-wide-heads", "qwen3-tied", "phi3"],
)
def test_the_architecture_converts_exactly(
    arch: str, head_dim: int, tied: bool, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """qwen3: no Q/K/V biases, a per-head RMSNorm on Q and on K before (NEOX) RoPE, heads wider than
    n_embd / n_head (Qwen3-0.6B: 16 x 128 over 1024), a head tied or not. phi3: the fused QKV and
    gate+up matrices split by rows (Q8_0 block rows: still exact), NEOX RoPE."""
    path = quantize(random_gguf(tmp_path / f"{arch}.gguf", arch, head_dim=head_dim, tied=tied), "q8_0",
                    tmp_path_factory)  # fmt: skip
    cfg = convert(path, tmp_path / "onnx")
    assert cfg.arch == arch and cfg.head_dim == head_dim and cfg.requantized == [], cfg.quantization
    assert cfg.n_ff == N_FF
    diff, top = max_logit_difference(path, tmp_path / "onnx", tmp_path_factory)
    assert diff < 1e-3 * top, (diff, top)


def test_phi3_long_rope_is_refused_with_the_reason(tmp_path: Path) -> None:
    """Phi-3.5 / Phi-4-mini's LongRoPE factors (llama.cpp picks the short or the long ones by context
    length) are not the graph's: the model stays on llama.cpp, and the error says why."""
    path = random_gguf(tmp_path / "phi3-long.gguf", "phi3",
                       extra=("rope_factors_long.weight", "rope_factors_short.weight"))  # fmt: skip
    with pytest.raises(ConversionError, match=r"LongRoPE \(rope_factors_long.weight, rope_factors_short.weight\)"):
        convert(path, tmp_path / "onnx")


def test_an_unsupported_architecture_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "gemma3.gguf"), "gemma3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConversionError) as err:
        convert(str(tmp_path / "gemma3.gguf"), tmp_path / "onnx")
    assert str(err.value) == f"architecture 'gemma3' has no NPU graph yet (supported: {', '.join(SUPPORTED_ARCHS)})"
    assert SUPPORTED_ARCHS == ("llama", "qwen2", "qwen3", "phi3")
