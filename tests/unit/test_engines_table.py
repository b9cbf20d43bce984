"""protocol/engines.py against the engines themselves: every registered engine has its row, each
row's capabilities are what the engine serves, and its tokenizer flag is whether it tokenizes.
The gateway decides with the table alone; this keeps the table honest."""

from __future__ import annotations

import importlib
import typing

from protocol import engines
from protocol.wire import (
    CountTokens,
    DetectSpeech,
    Diarize,
    Embed,
    Generate,
    GenerateImages,
    Logits,
    Recognize,
    Rerank,
    Speak,
    Transcribe,
)
from workers.engines import ENGINES

SERVES = {Generate: {"chat", "completion", "tools"}, CountTokens: set(), Logits: {"logits"}, Embed: {"embeddings"},
          Rerank: {"rerank"}, Recognize: {"ocr"}, Transcribe: {"transcription"}, Diarize: {"diarization"},
          Speak: {"speech"}, GenerateImages: {"images"}, DetectSpeech: {"vad"}}  # fmt: skip


def _classes(name: str) -> tuple[type, ...]:
    module, _, factory = ENGINES[name].partition(":")
    returns = typing.get_type_hints(getattr(importlib.import_module(module), factory))["return"]
    return typing.get_args(returns) or (returns,)


def test_every_registered_engine_has_a_row_and_no_row_is_orphaned() -> None:
    assert set(ENGINES) - {"fake"} == set(engines.ENGINES)


def test_a_rows_capabilities_are_what_its_engine_serves() -> None:
    for name, row in engines.ENGINES.items():
        if row.remote:
            continue  # an upstream model's capabilities are its descriptor's
        for cls in _classes(name):
            served = set().union(*(SERVES[kind] for kind in cls.serves))
            assert set(row.capabilities) == served, name
            # (the NPU engine's CPU fallback hands every other attribute to the llama.cpp engine)
            assert row.tokenizer == (hasattr(cls, "tokenize") or hasattr(cls, "__getattr__")), name


def test_units_follow_the_row() -> None:
    assert engines.info("llama_cpp").units == ("cpu", "gpu", "npu", "hybrid")
    assert engines.info("onnx").units == ("cpu", "npu")
    assert engines.info("whisper").units == ("cpu",)
    assert engines.info("vad").units == ("cpu",)
    assert engines.info("fake") == engines.EngineInfo(name="fake", capabilities=())
