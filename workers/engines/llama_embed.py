"""GGUF embedding and reranking models through llama.cpp (`embeddings=True` contexts).

The gateway sends a GGUF here (engine `llama_embed`) when its header declares a pooling or an
encoder architecture (gateway/memory.py: is_embedding_gguf); other GGUFs go to llama.py.

The context uses the pooling the model declares: mean/CLS/last give one vector per sequence;
`rank` (a reranker's classification head) gives scores, so the model is a cross-encoder and
serves reranking only; none gives token vectors, mean-pooled here. Each step packs as many
whole sequences as fit one batch (encoders need a whole sequence in one ubatch), runs one
`llama_decode`, reads one pooled row per sequence and clears the memory for the next batch.
"""

from __future__ import annotations

import ctypes
import os
import time

import llama_cpp as L
import numpy as np
import psutil
import structlog

from protocol.embeddings import EMBED_BATCH_TOKENS
from protocol.wire import PROTOCOL_VERSION, Embed, Ready, Rerank
from workers.embedding_jobs import (
    EmbeddingQueue,
    QueuedEngine,
    Seq,
    check_lengths,
    check_token_ids,
    pool,
)
from workers.engines import EngineError, EngineOptions
from workers.engines.llama_runtime import init_backend
from workers.engines.thread_governor import ThreadGovernor

log = structlog.get_logger("worker.llama_embed")

BATCH_TOKENS = EMBED_BATCH_TOKENS  # tokens per decode (and the longest input, if the model reads more)
MAX_SEQS = 64  # sequences per decode
POOLING_NAMES = {L.LLAMA_POOLING_TYPE_NONE: "none", L.LLAMA_POOLING_TYPE_MEAN: "mean",
                 L.LLAMA_POOLING_TYPE_CLS: "cls", L.LLAMA_POOLING_TYPE_LAST: "last",
                 L.LLAMA_POOLING_TYPE_RANK: "rank"}  # fmt: skip




class LlamaEmbedEngine(QueuedEngine):
    name = "llama_cpp"
    serves = (Embed, Rerank)

    def __init__(self, opts: EngineOptions) -> None:
        t0 = time.perf_counter()
        init_backend()
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = (999 if opts.ngl < 0 else opts.ngl) if opts.compute == "gpu" else 0
        model = L.llama_model_load_from_file(opts.model_path.encode(), mparams)
        if not model:
            raise EngineError(f"llama.cpp could not load {opts.model_path}", status=500)
        self.model = model
        self.compute = opts.compute
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = L.llama_model_n_ctx_train(model)
        self.max_len = max(1, min(self.n_ctx_train or BATCH_TOKENS, opts.nctx or BATCH_TOKENS, BATCH_TOKENS))
        self.n_batch = max(self.max_len, min(BATCH_TOKENS, self.max_len * MAX_SEQS))
        self.threads = self.max_threads = opts.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
        self.governor = ThreadGovernor(self.threads)

        cparams = L.llama_context_default_params()
        cparams.embeddings = True
        cparams.pooling_type = L.LLAMA_POOLING_TYPE_UNSPECIFIED  # the model's own
        cparams.n_ctx = self.n_batch
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch  # an encoder needs each sequence whole in one ubatch
        cparams.n_seq_max = MAX_SEQS
        cparams.kv_unified = True  # decoder embedders: the batch's sequences share one cache, cleared per batch
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.no_perf = True
        ctx = L.llama_init_from_model(model, cparams)
        if not ctx:
            L.llama_model_free(model)
            raise EngineError("llama.cpp could not create an embedding context", status=500)
        self.ctx = ctx
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
        raw = text.encode()
        cap = len(raw) + 8
        for _ in range(2):
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
            if n >= 0:
                return list(buf[:n])
            cap = -n  # too small: llama.cpp says how many it needs
        raise EngineError("llama.cpp could not tokenize the input", status=500)

    def _pair(self, query: str, doc: str) -> list[int]:
        """A (query, document) input as llama-server builds it for a reranker."""
        if self.rerank_template is not None:
            prompt = self.rerank_template.replace("{query}", query).replace("{document}", doc)
            return self._tokenize(prompt, False, True)
        v = self.vocab
        eos = L.llama_vocab_eos(v)
        if eos == L.LLAMA_TOKEN_NULL:
            eos = L.llama_vocab_sep(v)
        out = [L.llama_vocab_bos(v)] if L.llama_vocab_get_add_bos(v) else []
        out += self._tokenize(query, False)
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
                b.token[n] = tok
                b.pos[n] = pos
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = s_id
                b.logits[n] = True
                n += 1
        b.n_tokens = n
        if self.mem:
            L.llama_memory_clear(self.mem, True)
        self._use_threads(self.governor.threads_for_step())
        t0 = time.perf_counter()
        rc = L.llama_decode(self.ctx, b)
        self.governor.after_step(n, time.perf_counter() - t0)
        if rc != 0:
            raise EngineError(f"llama_decode failed with status {rc}", status=500)
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

    def _floats(self, ptr: ctypes._Pointer) -> np.ndarray:  # type: ignore[type-arg]
        if not ptr:
            raise EngineError("llama.cpp returned no embedding for a sequence", status=500)
        return np.ctypeslib.as_array(ptr, shape=(self.width,)).copy()

    # ---- Engine interface --------------------------------------------------

    def ready(self) -> Ready:
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, desc, 256)
        kind = "cross-encoder" if self.cross_encoder else "embedding"
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            engine=self.name,
            compute=self.compute,
            n_ctx=self.max_len,
            n_ctx_train=self.n_ctx_train,
            n_vocab=self.n_vocab,
            parallel=1,
            model_bytes=L.llama_model_size(self.model),
            load_seconds=round(self.load_seconds, 3),
            description=f"{desc.value.decode(errors='replace')} ({kind}, pooling "
            f"{POOLING_NAMES.get(self.pooling, self.pooling)})",
            provider="llama.cpp",
            n_embd=0 if self.cross_encoder else self.width,
        )

    def submit(self, req: Embed | Rerank) -> None:
        if isinstance(req, Embed):
            if req.token_ids is not None:
                check_token_ids(req.token_ids, self.n_vocab)
                seqs = [Seq(list(row)) for row in req.token_ids]
            else:
                seqs = [Seq(self._tokenize(t, True)) for t in req.texts or []]
            check_lengths(seqs, self.max_len)
            self.queue.submit_embed(req, seqs)
            return
        if self.cross_encoder:
            seqs = [Seq(self._pair(req.query, d)) for d in req.documents]
            check_lengths(seqs, self.max_len, "documents")
        else:
            seqs = [Seq(self._tokenize(t, True)) for t in (req.query, *req.documents)]
            check_lengths(seqs[:1], self.max_len, "query")
            check_lengths(seqs[1:], self.max_len, "documents")
        self.queue.submit_rerank(req, seqs)

    def set_threads(self, n: int) -> None:
        self.governor.set_cap(min(n, self.max_threads))
        self._use_threads(self.governor.threads)

    def idle(self) -> None:
        self.governor.idle()

    def _use_threads(self, n: int) -> None:
        if n != self.threads:
            L.llama_set_n_threads(self.ctx, n, n)
            self.threads = n

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


def load(opts: EngineOptions) -> LlamaEmbedEngine:
    return LlamaEmbedEngine(opts)

