"""The request queue of an embedding engine: Embed and Rerank jobs, one forward pass per step.

An engine turns a request into sequences of token ids (`Seq`) and supplies `forward`, which
runs one padded batch of them and returns one row per sequence: a pooled vector (embedding
models) or the classifier's logits (cross-encoders). This module does the rest, the same for
every engine: the checks, the batching (a job's sequences sorted by length, so a batch pads
little), the finishing (truncate to `dimensions`, L2-normalise, cosine for a bi-encoder
rerank) and the answer. A step runs one batch of the oldest job, so a Cancel or a new request
is seen between batches, never after a whole long request.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import structlog

from protocol.wire import Done, Embed, Embeddings, ErrorKind, Failed, Rerank, Scores
from workers.engines import Emit, EngineError

log = structlog.get_logger("worker.embed")

CROSS_ENCODER = "cross-encoder"
BI_ENCODER = "bi-encoder"


@dataclass(slots=True)
class Seq:
    """One model input: token ids, and the segment (token type) ids of a (query, document) pair."""

    ids: list[int]
    type_ids: list[int] | None = None


# (sequences, pairs) -> float32 [len(sequences), width]
Forward = Callable[[list[Seq], bool], np.ndarray]


@dataclass
class Job:
    req: Embed | Rerank
    seqs: list[Seq]
    batch: int
    pairs: bool  # cross-encoder (query, document) pairs
    order: list[int] = field(default_factory=list)
    done: int = 0
    out: np.ndarray | None = None
    started: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(len(s.ids) for s in self.seqs)


def check_token_ids(rows: Sequence[Sequence[int]], n_vocab: int) -> None:
    for i, row in enumerate(rows):
        if not row:
            raise EngineError(f"`input`[{i}] is an empty token list")
        bad = next((t for t in row if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise EngineError(f"`input`[{i}]: token id {bad} is outside the vocabulary (0..{n_vocab - 1})")


def check_lengths(seqs: Sequence[Seq], max_len: int, what: str = "input") -> None:
    for i, s in enumerate(seqs):
        if len(s.ids) > max_len:
            raise EngineError(
                f"`{what}`[{i}] is {len(s.ids)} tokens, but this model reads at most {max_len}; shorten it",
                code="context_length_exceeded",
            )


def cut_to(seqs: list[Seq], max_len: int) -> list[Seq]:
    """Each sequence at most `max_len` tokens (Embed's `truncate`): its head, and its last token,
    which is the end marker ([SEP], EOS) the model's pooling was trained to see."""
    return [s if len(s.ids) <= max_len else Seq([*s.ids[: max_len - 1], s.ids[-1]] if max_len > 1 else s.ids[:1])
            for s in seqs]  # fmt: skip


def finish(vectors: np.ndarray, *, dimensions: int = 0, normalize: bool = True) -> np.ndarray:
    """Truncate to `dimensions` (0: keep all), then scale each row to unit length."""
    out = np.asarray(vectors, dtype=np.float32)
    if dimensions:
        out = out[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(out, dtype="<f4")


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """Token vectors [b, t, d] to one vector per sequence, over the unmasked tokens."""
    m = mask.astype(np.float32)[:, :, None]
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return np.where(m > 0, hidden, -np.inf).max(axis=1)
    if mode == "lasttoken":
        last = mask.sum(axis=1).astype(np.int64) - 1
        return hidden[np.arange(hidden.shape[0]), last]
    summed = (hidden * m).sum(axis=1)
    counts = np.maximum(m.sum(axis=1), 1e-9)
    if mode == "mean_sqrt_len":
        return summed / np.sqrt(counts)
    return summed / counts  # mean


class EmbeddingQueue:
    """Jobs waiting or in progress, oldest first; `step` runs one batch of the oldest."""

    def __init__(self, forward: Forward, *, n_embd: int, max_batch: int, cross_encoder: bool) -> None:
        self.forward = forward
        self.n_embd = n_embd
        self.max_batch = max_batch
        self.cross_encoder = cross_encoder
        self.jobs: deque[Job] = deque()
        self.sequences_done = 0

    @property
    def mode(self) -> str:
        return CROSS_ENCODER if self.cross_encoder else BI_ENCODER

    def submit_embed(self, req: Embed, seqs: list[Seq]) -> None:
        if self.cross_encoder:
            raise EngineError("this model is a cross-encoder (a reranker): it scores pairs and has no embeddings")
        if not seqs:
            raise EngineError("`input` must not be empty")
        if req.dimensions < 0 or req.dimensions > self.n_embd:
            raise EngineError(f"`dimensions` must be between 1 and {self.n_embd} for this model, got {req.dimensions}")
        self._add(Job(req, seqs, self.max_batch, pairs=False))

    def submit_rerank(self, req: Rerank, seqs: list[Seq]) -> None:
        """`seqs`: the (query, document) pairs of a cross-encoder, else the query then the documents."""
        if not req.documents:
            raise EngineError("`documents` must not be empty")
        batch = max(1, min(req.batch_size, self.max_batch))
        self._add(Job(req, seqs, batch, pairs=self.cross_encoder))

    def _add(self, job: Job) -> None:
        job.order = sorted(range(len(job.seqs)), key=lambda i: len(job.seqs[i].ids))
        job.started = time.perf_counter()
        self.jobs.append(job)

    def has_work(self) -> bool:
        return bool(self.jobs)

    def cancel(self, req_id: int, emit: Emit) -> bool:
        for job in self.jobs:
            if job.req.req_id == req_id:
                self.jobs.remove(job)
                emit(Done(req_id, "cancelled", prompt_tokens=job.prompt_tokens))
                return True
        return False

    def step(self, emit: Emit) -> None:
        job = self.jobs[0]
        take = job.order[job.done : job.done + job.batch]
        try:
            rows = self.forward([job.seqs[i] for i in take], job.pairs)
        except EngineError as exc:
            self.jobs.popleft()
            emit(exc.failed(job.req.req_id))
            return
        except Exception as exc:  # one bad batch fails its request, not the worker
            self.jobs.popleft()
            log.exception("forward pass failed", request_id=job.req.log_id)
            emit(
                Failed(job.req.req_id, ErrorKind.ENGINE, f"the model failed on this input: {type(exc).__name__}: {exc}")
            )
            return
        if job.out is None:
            job.out = np.empty((len(job.seqs), rows.shape[1]), dtype=np.float32)
        job.out[take] = rows
        job.done += len(take)
        self.sequences_done += len(take)
        if job.done == len(job.seqs):
            self.jobs.popleft()
            emit(self._answer(job))

    def _answer(self, job: Job) -> Embeddings | Scores:
        req, out = job.req, job.out
        assert out is not None
        log.info("embedded", request_id=req.log_id, sequences=len(job.seqs), tokens=job.prompt_tokens,
                 seconds=round(time.perf_counter() - job.started, 4))  # fmt: skip
        if isinstance(req, Embed):
            vectors = finish(out, dimensions=req.dimensions, normalize=req.normalize)
            return Embeddings(req.req_id, vectors.shape[0], vectors.shape[1], vectors.tobytes(), job.prompt_tokens)
        if job.pairs:
            scores = out[:, 0] if out.shape[1] == 1 else out[:, -1]  # the "relevant" label's logit
        else:
            vectors = finish(out)
            scores = vectors[1:] @ vectors[0]
        return Scores(req.req_id, [float(s) for s in scores], job.prompt_tokens, self.mode)


class QueuedEngine:
    """The Engine methods of an embedding engine that only hand over to its EmbeddingQueue."""

    queue: EmbeddingQueue

    def cancel(self, req_id: int, emit: Emit) -> None:
        self.queue.cancel(req_id, emit)

    def has_work(self) -> bool:
        return self.queue.has_work()

    def idle(self) -> None:
        pass

    def step(self, emit: Emit) -> None:
        self.queue.step(emit)
