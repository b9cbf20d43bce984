"""The GGUF -> ONNX decoder converter is exact: its graph on onnxruntime's CPU EP against llama.cpp.

CPU only (no QNN needed), so it always runs. One conversion of the bundled SmolLM2 (Q4_1) serves
every test here.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp as L
import numpy as np
import pytest

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
    from argparse import Namespace

    from protocol import qnn
    from workers.engines.npu.engine import load

    monkeypatch.delenv(qnn.SIMULATOR_ENV, raising=False)
    monkeypatch.setattr(qnn, "is_simulated", lambda: True)  # an x86_64 host, as in CI
    opts = Namespace(model_path=bundled_gguf(), compute="npu", nctx=256, ngl=0, parallel=1, threads=1,
                     stream_interval_ms=0, batch_tokens=0, cache_ram_mb=0, cache_dir=str(tmp_path))  # fmt: skip
    engine = load(opts)
    try:
        ready = engine.ready()
        assert (ready.engine, ready.compute) == ("llama_cpp", "cpu")
        assert "no NPU" in ready.fallback and qnn.SIMULATOR_ENV in ready.fallback
        assert not any(tmp_path.iterdir())  # nothing was converted
    finally:
        engine.close()
