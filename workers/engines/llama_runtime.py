"""The one way this worker starts llama.cpp and creates a context: a KV stream per sequence slot."""

from __future__ import annotations

import ctypes
import os

import llama_cpp as L

from workers.engines import EngineError


@L.llama_log_callback
def _silent_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp's own chatter is noise in a service journal; errors surface as return codes.
    if level == 4 and os.environ.get("GENIEX_LLAMA_LOG"):  # GGML_LOG_LEVEL_ERROR
        print(text.decode(errors="replace"), end="", flush=True)


def init_backend() -> None:
    L.llama_backend_init()
    L.llama_log_set(_silent_log, ctypes.c_void_p(0))


def slot_context(model: ctypes.c_void_p, *, nctx: int, parallel: int, n_batch: int, threads: int,
                 what: str = "context") -> ctypes.c_void_p:  # fmt: skip
    """A context of `parallel` sequences of `nctx` tokens each (kv_unified=False: see llama.py)."""
    cparams = L.llama_context_default_params()
    cparams.n_ctx = nctx * parallel
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_batch
    cparams.n_seq_max = parallel
    cparams.kv_unified = False
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.no_perf = True
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        L.llama_model_free(model)
        raise EngineError(f"llama.cpp could not create a {what} of {cparams.n_ctx} tokens", status=500)
    return ctx
