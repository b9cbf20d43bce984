"""The GGUF -> ONNX decoder converter is exact: its graph on onnxruntime's CPU EP against llama.cpp.

CPU only (no QNN needed), so it always runs. The bundled SmolLM2 (Q4_1, whose matrices are
quantized again) and copies of it quantized by llama.cpp to Q4_0 and Q8_0 (repacked exactly), each
converted once.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp as L
import numpy as np
import pytest

from protocol.worker_args import WorkerArgs
from tests.npu_models import TinyGGUF, bundled_gguf, converted, converted_copy, progress, quantize
from workers.engines.npu.convert import DecoderConfig
from workers.engines.npu.decoder import Decoder, TokenEmbeddings, cpu_session_factory

PROMPT = b"The capital of France is Paris, and the capital of Italy is"
# Wide margins between the top tokens: llama.cpp rounds activations to 8 bits in its quantized dot
# products, the graph does not, and a near-tie could flip between the two.
SEQUENCE = b"Continue the sequence: 1, 2, 3, 4,"
N_CTX = 64
CHUNK = 8  # the 13-token prompt: one full chunk and one padded one
FP32_GRAPH_BYTES = 651_453_684  # the SmolLM2 graph of converter version 1: every weight fp32, the table twice


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Decoder:
    folder = converted(tmp_path_factory)
    return Decoder(folder, DecoderConfig.load(folder), N_CTX, cpu_session_factory(2), chunk=CHUNK)


def f32_logits(gguf: str, tokens: list[int]) -> np.ndarray:
    """llama.cpp's logits for every position, on F32 weights and an F32 KV cache."""
    llm = L.Llama(gguf, n_ctx=N_CTX, logits_all=True, verbose=False, type_k=L.GGML_TYPE_F32, type_v=L.GGML_TYPE_F32)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])


@pytest.mark.parametrize("ftype", ["q4_0", "q8_0"])
def test_the_graph_computes_with_exactly_the_ggufs_weights(
    ftype: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The Q4_0 (Q8_0) file converted, against llama.cpp on an F32 copy of that same file: the
    weights, the embedding rows looked up on the host and the tied head (the table, 8-bit, stored
    once as the head) are the file's, bit for bit, so only fp32 rounding separates the logits."""
    gguf, folder = converted_copy(ftype, tmp_path_factory)
    cfg = DecoderConfig.load(folder)
    assert cfg.quantization == f"{ftype} exact ({210 if ftype == 'q4_0' else 211} tensors)" + (
        ", q8_0 exact (1)" if ftype == "q4_0" else "")  # fmt: skip
    assert cfg.requantized == []
    llm = L.Llama(gguf, n_ctx=N_CTX, verbose=False, vocab_only=True)
    tokens = llm.tokenize(PROMPT, add_bos=False) + llm.tokenize(b" Rome.", add_bos=False)
    ref = f32_logits(quantize(gguf, "f32", tmp_path_factory), tokens)
    dec = Decoder(folder, cfg, N_CTX, cpu_session_factory(2), chunk=CHUNK)
    got = [dec.prefill(tokens[:-3])] + [dec.decode(t) for t in tokens[-3:]]
    diffs = [float(np.abs(g - r).max()) for g, r in zip(got, ref[-4:], strict=True)]
    assert max(diffs) < 1e-3, diffs


@pytest.mark.parametrize("ftype", ["q4_0", "q8_0"])
def test_16_greedy_tokens_match_llama_cpp_on_the_same_file(
    ftype: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    gguf, folder = converted_copy(ftype, tmp_path_factory)
    llm = L.Llama(gguf, n_ctx=N_CTX, verbose=False)
    tokens = llm.tokenize(SEQUENCE, add_bos=False)
    want = []
    for tok in llm.generate(tokens, temp=0.0, top_k=1):
        want.append(tok)
        if len(want) == 16:
            break
    dec = Decoder(folder, DecoderConfig.load(folder), N_CTX, cpu_session_factory(2), chunk=CHUNK)
    logits, got = dec.prefill(tokens), []
    for _ in range(16):
        assert logits is not None
        got.append(int(np.argmax(logits)))
        logits = dec.decode(got[-1])
    assert got == want, (llm.detokenize(got), llm.detokenize(want))


def test_weights_are_4_bit_and_the_table_is_written_once(tmp_path_factory: pytest.TempPathFactory) -> None:
    import onnx

    _, folder = converted_copy("q4_0", tmp_path_factory)
    cfg = DecoderConfig.load(folder)
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size <= FP32_GRAPH_BYTES / 3, size
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    assert graph.input[0].name == "inputs_embeds" and "Gather" not in {n.op_type for n in graph.node}
    assert len([n for n in graph.node if n.op_type == "MatMulNBits"]) == 7 * cfg.n_layer + 1
    inits = {t.name for t in graph.initializer}
    assert {n.input[1] for n in graph.node if n.op_type == "MatMul"} & inits == {"rope_rotate_half"}  # no float weight
    # The vocab x width table appears once: as the head's blocks.
    table = [t.name for t in graph.initializer if cfg.n_vocab in t.dims]
    assert table == ["lm_head"], table
    # Every other float initializer is a norm or a small constant.
    floats = [t for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and not t.name.endswith(".scales")]
    assert all(t.name.endswith("norm.weight") or t.name.startswith("rope") for t in floats), [t.name for t in floats]


def test_embedding_rows_are_the_ggufs(tmp_path_factory: pytest.TempPathFactory) -> None:
    import gguf as gg

    path, folder = converted_copy("q4_0", tmp_path_factory)
    embed = TokenEmbeddings(DecoderConfig.load(folder))
    table = next(t for t in gg.GGUFReader(path).tensors if t.name == "token_embd.weight")
    ids = [0, 1, 17, 49151, 17]
    want = gg.quants.dequantize(np.asarray(table.data)[ids], table.tensor_type)
    assert np.array_equal(embed(ids), want)


def test_other_quantizations_are_quantized_again_and_said_so(decoder: Decoder) -> None:
    """The bundled Q4_1 file: its Q4_1 matrices quantized again to 4-bit Q4_0 blocks (its Q8_0
    table kept as it is), and still the CPU engine's greedy answer on a prompt with wide margins."""
    cfg = decoder.cfg
    assert cfg.quantization == "requantized q4_1→4-bit (210 tensors), q8_0 exact (1)"
    assert cfg.requantized is not None and len(cfg.requantized) == 210 and "token_embd.weight" not in cfg.requantized
    assert any(p == f"converted 30/30 layers; weights: {cfg.quantization}" for p in progress)
    llm = L.Llama(bundled_gguf(), n_ctx=N_CTX, verbose=False)
    tokens = llm.tokenize(SEQUENCE, add_bos=False)
    want = []
    for tok in llm.generate(tokens, temp=0.0, top_k=1):
        want.append(tok)
        if len(want) == 8:
            break
    decoder.reset()
    logits, got = decoder.prefill(tokens), []
    for _ in range(8):
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
    n_vocab, n_embd, n_head, n_kv, n_ff, n_layer = 49152, 64, 4, 2, 96, 2
    kv_dim = n_kv * n_embd // n_head
    g = TinyGGUF(path, arch, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_kv=n_kv)
    g.w.add_rope_freq_base(10000.0)
    g.w.add_layer_norm_rms_eps(1e-6)
    t = g.tensor
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
    return g.write()


def test_a_qwen2_model_converts_exactly(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """qwen2: Q/K/V biases, NEOX RoPE (rows already in rotate-half order), an untied head; Q8_0 by
    llama.cpp's quantizer, against llama.cpp on an F32 copy of that file."""
    from workers.engines.npu.convert import convert

    path = quantize(tiny_gguf(tmp_path / "qwen2.gguf", "qwen2"), "q8_0", tmp_path_factory)
    cfg = convert(path, tmp_path / "onnx")
    assert cfg.arch == "qwen2" and cfg.requantized == [], cfg.quantization
    llm = L.Llama(path, n_ctx=64, verbose=False, vocab_only=True)
    tokens = llm.tokenize(PROMPT, add_bos=False)
    ref = f32_logits(quantize(path, "f32", tmp_path_factory), tokens)
    dec = Decoder(tmp_path / "onnx", cfg, 64, cpu_session_factory(2), chunk=CHUNK)
    got = [dec.prefill(tokens[:5])] + [dec.decode(t) for t in tokens[5:]]
    diff = max(float(np.abs(g - r).max()) for g, r in zip(got, ref[4:], strict=True))
    assert diff < 1e-3 * float(np.abs(ref).max()), (diff, float(np.abs(ref).max()))


@pytest.mark.parametrize("ftype", ["q4_0", "q8_0"])
def test_the_plan_counts_what_the_converter_writes(ftype: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The plan is made from the header alone (the gateway's `geniex npu plan`), and is within 1% of
    the weights the converter writes, 8-bit layers included."""
    from protocol.gguf_header import npu_shape
    from protocol.npu_plan import split

    gguf, folder = converted_copy(ftype, tmp_path_factory)
    cfg = DecoderConfig.load(folder)
    assert cfg.shape() == npu_shape(gguf)
    planned = sum(p.weight_bytes for p in split(npu_shape(gguf)))
    written = sum((folder / p.weights).stat().st_size for p in cfg.graph_parts())
    assert abs(written - planned) <= 0.01 * planned, (ftype, written, planned)
