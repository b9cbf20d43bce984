"""GGUF embedding and reranking models through llama.cpp (`embeddings=True` contexts).

The gateway sends a GGUF here (engine `llama_embed`) when its header declares a pooling or an
encoder architecture (gateway/supervisor/memory.py: is_embedding_gguf); other GGUFs go to llama/.

The context uses the pooling the model declares: mean/CLS/last give one vector per sequence;
`rank` (a reranker's classification head) gives scores, so the model is a cross-encoder and
serves reranking only; none gives token vectors, mean-pooled here. Each step packs as many
whole sequences as fit one batch (encoders need a whole sequence in one ubatch), runs one
`llama_decode`, reads one pooled row per sequence and clears the memory for the next batch.
"""

from __future__ import annotations

import ctypes
import time

import llama_cpp as L
import numpy as np
import structlog

from protocol.wire import Embed, ErrorKind, Ready, Rerank
from workers.embedding_jobs import (
    EmbeddingQueue,
    QueuedEngine,
    Seq,
    check_lengths,
    check_token_ids,
    cut_to,
    pool,
)
from workers.engines import EngineError, EngineOptions
from workers.engines.llama_runtime import (
    Threads,
    VocabTokens,
    default_threads,
    gpu_layers,
    init_backend,
    keep_on_cpu,
    kv_bytes_per_token,
    load_model,
    put,
    ready,
    runs_on,
    tokenize,
)

log = structlog.get_logger("worker.llama_embed")

BATCH_TOKENS = 2048  # tokens per decode (and the longest input) unless the gateway says (--batch-tokens)
MAX_SEQS = 64  # sequences per decode
POOLING_NAMES = {L.LLAMA_POOLING_TYPE_NONE: "none", L.LLAMA_POOLING_TYPE_MEAN: "mean",
                 L.LLAMA_POOLING_TYPE_CLS: "cls", L.LLAMA_POOLING_TYPE_LAST: "last",
                 L.LLAMA_POOLING_TYPE_RANK: "rank"}  # fmt: skip


class LlamaEmbedEngine(QueuedEngine, VocabTokens):
    name = "llama_cpp"
    serves = (Embed, Rerank)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        init_backend()
        self.compute, self.fallback = runs_on(opts.compute)
        self.n_gpu_layers = gpu_layers(self.compute, opts.ngl)
        model = load_model(opts.model_path, self.n_gpu_layers)
        self.model = model
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = L.llama_model_n_ctx_train(model)
        batch = opts.batch_tokens or BATCH_TOKENS
        self.max_len = max(1, min(self.n_ctx_train or batch, opts.nctx or batch, batch))
        self.n_batch = max(self.max_len, min(batch, self.max_len * MAX_SEQS))
        threads = default_threads(opts.threads)

        cparams = L.llama_context_default_params()
        cparams.embeddings = True
        cparams.pooling_type = L.LLAMA_POOLING_TYPE_UNSPECIFIED  # the model's own
        cparams.n_ctx = self.n_batch
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch  # an encoder needs each sequence whole in one ubatch
        cparams.n_seq_max = MAX_SEQS
        cparams.kv_unified = True  # decoder embedders: the batch's sequences share one cache, cleared per batch
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.no_perf = True
        keep_on_cpu(cparams, self.n_gpu_layers > 0)
        ctx = L.llama_init_from_model(model, cparams)
        if not ctx:
            L.llama_model_free(model)
            raise EngineError("llama.cpp could not create an embedding context", kind=ErrorKind.ENGINE)
        self.ctx = ctx
        self.threads = Threads(threads, lambda: [self.ctx])
        self.mem = L.llama_get_memory(ctx)
        self.pooling = L.llama_pooling_type(ctx)
        self.cross_encoder = self.pooling == L.LLAMA_POOLING_TYPE_RANK
        if self.cross_encoder:
            self.width = max(1, L.llama_model_n_cls_out(model))
        else:
            self.width = L.llama_model_n_embd_out(model) or L.llama_model_n_embd(model)
        self.rerank_template = self._rerank_template()
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.queue = EmbeddingQueue(self._forward, n_embd=0 if self.cross_encoder else self.width,
                                    max_batch=MAX_SEQS, cross_encoder=self.cross_encoder)  # fmt: skip
        self.load_seconds = time.perf_counter() - t0
        log.info("gguf embedding model loaded", pooling=POOLING_NAMES.get(self.pooling, str(self.pooling)),
                 width=self.width, max_len=self.max_len, cross_encoder=self.cross_encoder)  # fmt: skip

    def _rerank_template(self) -> str | None:
        raw = L.llama_model_chat_template(self.model, b"rerank")
        return raw.decode(errors="replace") if raw else None

    # ---- tokens --------------------------------------------------------------

    def _tokenize(self, text: str, add_special: bool, parse_special: bool = False) -> list[int]:
        return tokenize(self.vocab, text, add_special=add_special, parse_special=parse_special)

    def _pair(self, query: str, query_ids: list[int], doc: str) -> list[int]:
        """A (query, document) input as llama-server builds it for a reranker (`query_ids`: the
        query tokenized once for every document)."""
        if self.rerank_template is not None:
            prompt = self.rerank_template.replace("{query}", query).replace("{document}", doc)
            return self._tokenize(prompt, False, True)
        v = self.vocab
        eos = L.llama_vocab_eos(v)
        if eos == L.LLAMA_TOKEN_NULL:
            eos = L.llama_vocab_sep(v)
        out = [L.llama_vocab_bos(v)] if L.llama_vocab_get_add_bos(v) else []
        out += query_ids
        if L.llama_vocab_get_add_eos(v):
            out.append(eos)
        if L.llama_vocab_get_add_sep(v):
            out.append(L.llama_vocab_sep(v))
        out += self._tokenize(doc, False)
        if L.llama_vocab_get_add_eos(v):
            out.append(eos)
        return out

    # ---- forward ---------------------------------------------------------------

    def _forward(self, seqs: list[Seq], pairs: bool) -> np.ndarray:
        """Embed `seqs` in as few decodes as fit the batch; one row per sequence."""
        out = np.empty((len(seqs), self.width), dtype=np.float32)
        start = 0
        while start < len(seqs):
            n_tok, end = 0, start
            while end < len(seqs) and end - start < MAX_SEQS and n_tok + len(seqs[end].ids) <= self.n_batch:
                n_tok += len(seqs[end].ids)
                end += 1
            out[start:end] = self._decode(seqs[start:end])
            start = end
        return out

    def _decode(self, seqs: list[Seq]) -> np.ndarray:
        b = self.batch
        n = 0
        for s_id, s in enumerate(seqs):
            for pos, tok in enumerate(s.ids):
                n = put(b, n, tok, pos, s_id)
        b.n_tokens = n
        if self.mem:
            L.llama_memory_clear(self.mem, True)
        self.threads.before_step()
        t0 = time.perf_counter()
        rc = L.llama_decode(self.ctx, b)
        self.threads.after_step(n, time.perf_counter() - t0)
        if rc != 0:
            raise EngineError(f"llama_decode failed with status {rc}", kind=ErrorKind.ENGINE)
        rows = np.empty((len(seqs), self.width), dtype=np.float32)
        if self.pooling == L.LLAMA_POOLING_TYPE_NONE:  # token vectors: mean-pool them here
            first = 0
            for i, s in enumerate(seqs):
                count = len(s.ids)
                tokens = np.stack([self._floats(L.llama_get_embeddings_ith(self.ctx, first + j)) for j in range(count)])
                rows[i] = pool(tokens[None], np.ones((1, count)), "mean")[0]
                first += count
            return rows
        for i in range(len(seqs)):
            rows[i] = self._floats(L.llama_get_embeddings_seq(self.ctx, i))
        return rows

    def _floats(self, ptr: ctypes._Pointer[ctypes.c_float]) -> np.ndarray:
        if not ptr:
            raise EngineError("llama.cpp returned no embedding for a sequence", kind=ErrorKind.ENGINE)
        return np.ctypeslib.as_array(ptr, shape=(self.width,)).copy()

    # ---- Engine interface --------------------------------------------------

    def ready(self) -> Ready:
        kind = "cross-encoder" if self.cross_encoder else "embedding"
        return ready(self.model, engine=self.name, compute=self.compute, n_ctx=self.max_len, parallel=1,
                     load_seconds=self.load_seconds, n_gpu_layers=self.n_gpu_layers,
                     description=f"{kind}, pooling {POOLING_NAMES.get(self.pooling, self.pooling)}",
                     provider="llama.cpp", n_embd=0 if self.cross_encoder else self.width,
                     fallback=self.fallback, **self._kv_facts())  # fmt: skip

    def _kv_facts(self) -> dict[str, object]:
        """Its KV cache, as Ready reports it: f16 (it holds one batch and is cleared after it, so
        quantizing it would change every vector to save one batch's cache), none for an encoder, which
        llama.cpp gives no memory."""
        if not self.mem:
            return {}
        return {"kv_bytes_per_token": kv_bytes_per_token(self.model, "f16", "f16"), "cache_type_k": "f16",
                "cache_type_v": "f16"}  # fmt: skip

    def submit(self, req: Embed | Rerank) -> None:
        if isinstance(req, Embed):
            if req.token_ids is not None:
                check_token_ids(req.token_ids, self.n_vocab)
                seqs = [Seq(list(row)) for row in req.token_ids]
            else:
                seqs = [Seq(self._tokenize(t, True)) for t in req.texts or []]
            seqs = cut_to(seqs, self.max_len) if req.truncate else seqs
            check_lengths(seqs, self.max_len)
            self.queue.submit_embed(req, seqs)
            return
        if self.cross_encoder:
            # A query too long for the model is refused once, not found again in every pair.
            query_ids = self._tokenize(req.query, False)
            check_lengths([Seq(query_ids)], self.max_len, "query")
            seqs = [Seq(self._pair(req.query, query_ids, d)) for d in req.documents]
            check_lengths(seqs, self.max_len, "documents")
        else:
            seqs = [Seq(self._tokenize(t, True)) for t in (req.query, *req.documents)]
            check_lengths(seqs[:1], self.max_len, "query")
            check_lengths(seqs[1:], self.max_len, "documents")
        self.queue.submit_rerank(req, seqs)

    def set_threads(self, n: int) -> None:
        self.threads.set_share(n)

    def idle(self) -> None:
        self.threads.idle()

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


def load(opts: EngineOptions) -> LlamaEmbedEngine:
    return LlamaEmbedEngine(opts)
