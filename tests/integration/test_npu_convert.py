"""The GGUF -> ONNX decoder converter is exact: its graph on onnxruntime's CPU EP against llama.cpp.

CPU only (no QNN needed), so it always runs. One conversion of the bundled SmolLM2 (Q4_1) serves
every test here.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp as L
import numpy as np
import pytest

from protocol.worker_args import WorkerArgs
from tests.npu_models import bundled_gguf, converted, progress
from workers.engines.npu.convert import DecoderConfig
from workers.engines.npu.decoder import Decoder, cpu_session_factory

PROMPT = b"The capital of France is Paris, and the capital of Italy is"
N_CTX = 64
CHUNK = 8  # the 13-token prompt: one full chunk and one padded one


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Decoder:
    folder = converted(tmp_path_factory)
    return Decoder(folder, DecoderConfig.load(folder), N_CTX, cpu_session_factory(2), chunk=CHUNK)


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An F32 copy of the bundled model, made by llama.cpp's own quantize tool (dequantizing)."""
    out = str(tmp_path_factory.mktemp("f32") / "smollm2-f32.gguf")
    params = L.llama_model_quantize_default_params()
    params.ftype = L.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    assert L.llama_model_quantize(bundled_gguf().encode(), out.encode(), params) == 0
    return out


def test_logits_match_llama_cpp_on_an_f32_copy(decoder: Decoder, f32_gguf: str) -> None:
    # F32 weights and an F32 KV cache on both sides: any difference is the converter's.
    llm = L.Llama(f32_gguf, n_ctx=N_CTX, logits_all=True, verbose=False,
                  type_k=L.GGML_TYPE_F32, type_v=L.GGML_TYPE_F32)  # fmt: skip
    tokens = llm.tokenize(PROMPT, add_bos=False)
    follow = llm.tokenize(b" Rome.", add_bos=False)
    llm.eval(tokens + follow)
    ref = np.array(llm.scores[: len(tokens) + len(follow)])
    decoder.reset()
    got = [decoder.prefill(tokens)] + [decoder.decode(t) for t in follow]
    diffs = [float(np.abs(g - r).max()) for g, r in zip(got, ref[len(tokens) - 1 :], strict=False)]
    assert len(diffs) == 1 + len(follow)
    assert max(diffs) < 1e-3, diffs


def test_16_greedy_tokens_match_llama_cpp_on_the_q4_1_gguf(decoder: Decoder) -> None:
    llm = L.Llama(bundled_gguf(), n_ctx=N_CTX, verbose=False)
    tokens = llm.tokenize(PROMPT, add_bos=False)
    want = []
    for tok in llm.generate(tokens, temp=0.0, top_k=1):
        want.append(tok)
        if len(want) == 16:
            break
    decoder.reset()
    logits, got = decoder.prefill(tokens), []
    for _ in range(16):
        assert logits is not None
        got.append(int(np.argmax(logits)))
        logits = decoder.decode(got[-1])
    assert got == want, (llm.detokenize(got), llm.detokenize(want))


def test_a_second_load_reuses_the_converted_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    first = converted(tmp_path_factory)
    from workers.engines.npu.convert import cached_or_convert

    again = cached_or_convert(bundled_gguf(), first.parent, progress=lambda m: pytest.fail(f"converted again: {m}"))
    assert again == first
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # no temporary folder left behind
    assert Path(first / "model.onnx").is_file()
    # The first conversion said what it was doing, a line per quarter of the layers.
    assert progress[0].startswith("converting SmolLM2-135M-Instruct.Q4_1.gguf (llama, 30 layers)")
    assert [p for p in progress if p.startswith("converted ")][:4] == [
        "converted 7/30 layers", "converted 14/30 layers", "converted 21/30 layers", "converted 28/30 layers"]  # fmt: skip


def test_without_an_npu_the_worker_runs_the_model_on_the_cpu_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from protocol import qnn
    from workers.engines.npu.engine import load

    monkeypatch.delenv(qnn.SIMULATOR_ENV, raising=False)
    monkeypatch.setattr(qnn, "is_simulated", lambda: True)  # an x86_64 host, as in CI
    opts = WorkerArgs(engine="llama_npu", model_path=bundled_gguf(), compute="npu", nctx=256, ngl=0, parallel=1, threads=1,
                     stream_interval_ms=0, batch_tokens=0, cache_ram_mb=0, cache_dir=str(tmp_path))  # fmt: skip
    engine = load(opts)
    try:
        ready = engine.ready()
        assert (ready.engine, ready.compute) == ("llama_cpp", "cpu")
        assert "no NPU" in ready.fallback and qnn.SIMULATOR_ENV in ready.fallback
        assert not any(tmp_path.iterdir())  # nothing was converted
    finally:
        engine.close()


def tiny_gguf(path: Path, arch: str) -> str:
    """A random 2-layer model of `arch` with the bundled model's tokenizer (llama.cpp needs one),
    biased Q/K/V and an untied output head: the parts a real model of that family has."""
    import gguf

    src = gguf.GGUFReader(bundled_gguf())
    rng = np.random.default_rng(0)
    n_vocab, n_embd, n_head, n_kv, n_ff, n_layer = 49152, 64, 4, 2, 96, 2
    kv_dim = n_kv * n_embd // n_head
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    for key, add in (("tokens", w.add_token_list), ("token_type", w.add_token_types), ("merges", w.add_token_merges)):
        add(src.fields[f"tokenizer.ggml.{key}"].contents())
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def t(name: str, *shape: int, scale: float = 0.2, base: float = 0.0) -> None:
        w.add_tensor(name, (base + scale * rng.standard_normal(shape)).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd, scale=1.0)
    t("output_norm.weight", n_embd, scale=0.1, base=1.0)
    t("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        t(p + "attn_norm.weight", n_embd, scale=0.1, base=1.0)
        t(p + "ffn_norm.weight", n_embd, scale=0.1, base=1.0)
        for name, rows in (("attn_q", n_embd), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            t(p + name + ".weight", rows, n_embd)
            t(p + name + ".bias", rows)
        t(p + "attn_output.weight", n_embd, n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_a_qwen2_model_converts_exactly(tmp_path: Path) -> None:
    """qwen2: Q/K/V biases, NEOX RoPE (rows already in rotate-half order), an untied head."""
    from workers.engines.npu.convert import convert

    path = tiny_gguf(tmp_path / "qwen2.gguf", "qwen2")
    cfg = convert(path, tmp_path / "onnx")
    assert cfg.arch == "qwen2"
    llm = L.Llama(path, n_ctx=64, logits_all=True, verbose=False, type_k=L.GGML_TYPE_F32, type_v=L.GGML_TYPE_F32)
    tokens = llm.tokenize(PROMPT, add_bos=False)
    llm.eval(tokens)
    ref = np.array(llm.scores[: len(tokens)])
    dec = Decoder(tmp_path / "onnx", cfg, 64, cpu_session_factory(2), chunk=CHUNK)
    got = [dec.prefill(tokens[:5])] + [dec.decode(t) for t in tokens[5:]]
    diff = max(float(np.abs(g - r).max()) for g, r in zip(got, ref[4:], strict=True))
    assert diff < 1e-3 * float(np.abs(ref).max()), (diff, float(np.abs(ref).max()))
