"""The in-process baseline (llama-cpp-python's high-level `Llama`) and raw llama.cpp probes.

`Baseline` is what a user would get by calling llama-cpp-python directly: same GGUF,
same chat messages, greedy, same max tokens, `n_ctx` = the server's per-request context,
`n_threads` = physical cores, `flash_attn=True`, streamed through
`create_chat_completion(stream=True)` and timed exactly like the server's stream.

`Llama` keeps the evaluated prompt and reuses the matching prefix on the next call,
which would make every warm round after the first skip prompt evaluation. Each round
therefore calls `llm.reset()` first (n_tokens = 0, so `generate` finds no prefix and
evaluates the whole prompt), like the server, which clears a slot before admitting
a request.

`lowlevel_probe` times bare llama.cpp calls (no Python per-token work beyond one
ctypes call) in a given context layout, to split the server's numbers into
"what llama.cpp costs" and "what we add".
"""

from __future__ import annotations

import ctypes
import statistics
import time
from typing import Any

import llama_cpp as L


def _delta_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    return (choices[0].get("delta") or {}).get("content") or ""


class Baseline:
    def __init__(self, path: str, *, n_ctx: int, threads: int, max_tokens: int, messages: list[dict]) -> None:
        self.path = path
        self.n_ctx = n_ctx
        self.threads = threads
        self.max_tokens = max_tokens
        self.messages = messages
        t0 = time.perf_counter()
        self.llm = self._new()
        self.load_s = time.perf_counter() - t0
        self.prompt_tokens: list[int] | None = None

    def _new(self) -> L.Llama:
        return L.Llama(
            self.path,
            n_ctx=self.n_ctx,
            n_threads=self.threads,
            n_threads_batch=self.threads,
            flash_attn=True,
            verbose=False,
        )

    def load_times(self, n: int) -> list[float]:
        """Seconds to construct (load + context) a fresh `Llama` on the same GGUF, n times."""
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            llm = self._new()
            out.append(time.perf_counter() - t0)
            llm.close()
        return out

    def round(self, max_tokens: int | None = None) -> dict[str, Any]:
        llm = self.llm
        llm.reset()
        parts: list[str] = []
        n_chunks = 0
        t_first = t_last = None
        finish = None
        t_send = time.perf_counter()
        stream = llm.create_chat_completion(
            self.messages, temperature=0.0, max_tokens=max_tokens or self.max_tokens, stream=True, repeat_penalty=1.0
        )
        for chunk in stream:
            text = _delta_text(chunk)  # type: ignore[arg-type]
            if chunk["choices"] and chunk["choices"][0].get("finish_reason"):  # type: ignore[index]
                finish = chunk["choices"][0]["finish_reason"]  # type: ignore[index]
            if text:
                now = time.perf_counter()
                if t_first is None:
                    t_first = now
                t_last = now
                n_chunks += 1
                parts.append(text)
        t_end = time.perf_counter()
        # After a length stop, the last sampled token was never evaluated: n_tokens = prompt + gen - 1.
        prompt_len = llm.n_tokens - (n_chunks - 1)
        if self.prompt_tokens is None and finish == "length" and prompt_len > 0:
            self.prompt_tokens = [int(t) for t in llm.input_ids[:prompt_len]]
        return _timing(t_send, t_first, t_last, t_end, n_chunks, n_chunks, "".join(parts), finish,
                       prompt_len if finish == "length" else None)  # fmt: skip

    def prompt_eval_ms(self, reps: int) -> float | None:
        """Median ms of `llm.eval(prompt)` alone, from a reset state."""
        if not self.prompt_tokens:
            return None
        out = []
        for _ in range(reps):
            self.llm.reset()
            t0 = time.perf_counter()
            self.llm.eval(self.prompt_tokens)
            out.append((time.perf_counter() - t0) * 1000)
        self.llm.reset()
        return statistics.median(out)

    def close(self) -> None:
        self.llm.close()


def _timing(t_send, t_first, t_last, t_end, tokens, chunks, text, finish, prompt_tokens) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    ttft = (t_first - t_send) if t_first is not None else None
    span = (t_last - t_first) if t_first is not None and t_last is not None else 0.0
    decode = (tokens - 1) / span if tokens and tokens > 1 and span > 0 else None
    return {
        "ttft_ms": ttft * 1000 if ttft is not None else None,
        "decode_tps": decode,
        "tokens": tokens,
        "chunks": chunks,
        "total_s": t_end - t_send,
        "finish": finish,
        "prompt_tokens": prompt_tokens,
        "text": text,
    }


# ---- bare llama.cpp -----------------------------------------------------------


def lowlevel_probe(
    path: str, *, n_ctx: int, n_seq: int, threads: int, prompt: list[int], reps: int = 5, steps: int = 48
) -> dict[str, Any]:
    """Load + context + prompt eval + single-token steps with raw llama.cpp calls.

    The context is the worker's (workers/engines/llama_runtime.py): `n_ctx` per
    sequence, `n_seq` sequences, non-unified KV, batch 512, flash attention left at
    llama.cpp's default (auto), greedy native sampler.
    """
    L.llama_backend_init()
    t0 = time.perf_counter()
    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = L.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    t1 = time.perf_counter()
    # The worker's own helper, so this measures exactly the worker's layout.
    from workers.engines.llama_runtime import slot_context

    ctx = slot_context(model, nctx=n_ctx, parallel=n_seq, n_batch=512, threads=threads)
    t2 = time.perf_counter()
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(512, 0, 1)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())

    def put(i: int, tok: int, pos: int, logits: bool, seq: int = 0) -> None:
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits

    prompt_ms: list[float] = []
    step_ms: list[float] = []
    try:
        for _ in range(reps):
            L.llama_memory_seq_rm(mem, 0, -1, -1)
            for i, tok in enumerate(prompt):
                put(i, tok, i, i == len(prompt) - 1)
            batch.n_tokens = len(prompt)
            a = time.perf_counter()
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed on the prompt")
            prompt_ms.append((time.perf_counter() - a) * 1000)
        # Single-token steps after the (last) prompt: the decode loop's floor.
        tok = L.llama_sampler_sample(chain, ctx, len(prompt) - 1)
        pos = len(prompt)
        for _ in range(steps):
            put(0, tok, pos, True)
            batch.n_tokens = 1
            a = time.perf_counter()
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed on a step")
            tok = L.llama_sampler_sample(chain, ctx, 0)
            step_ms.append((time.perf_counter() - a) * 1000)
            pos += 1
        # Every sequence decoding at once: one batch of n_seq tokens per step, as the engine does
        # when n_seq requests run together.
        multi_ms: list[float] = []
        if n_seq > 1:
            toks, poss = [], []
            for sq in range(n_seq):
                L.llama_memory_seq_rm(mem, sq, -1, -1)
                for i, t in enumerate(prompt):
                    put(i, t, i, i == len(prompt) - 1, sq)
                batch.n_tokens = len(prompt)
                if L.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed on a prompt")
                toks.append(L.llama_sampler_sample(chain, ctx, len(prompt) - 1))
                poss.append(len(prompt))
            for _ in range(steps):
                for sq in range(n_seq):
                    put(sq, toks[sq], poss[sq], True, sq)
                    poss[sq] += 1
                batch.n_tokens = n_seq
                a = time.perf_counter()
                if L.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed on a multi-sequence step")
                toks = [L.llama_sampler_sample(chain, ctx, sq) for sq in range(n_seq)]
                multi_ms.append((time.perf_counter() - a) * 1000)
    finally:
        L.llama_sampler_free(chain)
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    step = statistics.median(step_ms)
    return {
        "n_ctx_per_seq": n_ctx,
        "n_seq": n_seq,
        "threads": threads,
        "flash_attn_type": int(L.llama_context_default_params().flash_attn_type),  # slot_context keeps the default
        "model_load_ms": (t1 - t0) * 1000,
        "context_ms": (t2 - t1) * 1000,
        "prompt_tokens": len(prompt),
        "prompt_eval_ms": statistics.median(prompt_ms),
        "step_ms": step,
        "step_tps": 1000.0 / step if step > 0 else None,
        "multi_step_ms": statistics.median(multi_ms) if multi_ms else None,
        "multi_step_tps": n_seq * 1000.0 / statistics.median(multi_ms) if multi_ms else None,
    }


def silence_llama_log() -> None:
    """Keep llama.cpp's stderr chatter out of the report (the Llama class does it per call)."""
    global _LOG_CB  # keep the callback alive
    _LOG_CB = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))


_LOG_CB = None
