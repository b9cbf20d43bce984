"""The voice activity engine on the real Silero VAD v6 graph (faster-whisper's copy) and real speech:
what it finds, that a stream's state makes chunked audio read as the whole clip, its resampling, and
what it refuses."""

from __future__ import annotations

from collections.abc import Iterator

import av
import numpy as np
import pytest

from gateway.models.store import VAD_MODEL_ID, bundled_models
from protocol.wire import VAD_WINDOW_MS, DetectSpeech, Done, FromWorker, SpeechProbs
from protocol.worker_args import WorkerArgs
from tests.speech import SAMPLE_RATE, beckett_pcm
from workers.engines import EngineError
from workers.engines.vad import STATE_HEADER, WINDOW, Resampler, VadEngine

SPEECH_S = 7.2  # five of the clip's six phrases, cut in the pause after the fifth: with the silence, one request
SILENCE_S = 2


@pytest.fixture(scope="module")
def engine() -> Iterator[VadEngine]:
    path = next((e.path for e in bundled_models() if e.id == VAD_MODEL_ID), None)
    if path is None:
        pytest.skip("faster-whisper (the audio extra) is not installed")
    e = VadEngine(WorkerArgs(engine="vad", model_path=path))
    yield e
    e.close()


def speech() -> np.ndarray:
    return beckett_pcm()[: int(SPEECH_S * SAMPLE_RATE)]


def clip() -> np.ndarray:
    """SPEECH_S of the Beckett clip, then SILENCE_S of digital silence."""
    return np.concatenate([speech(), np.zeros(SILENCE_S * SAMPLE_RATE, dtype="<i2")])


def at_rate(pcm: np.ndarray, rate: int) -> np.ndarray:
    """16 kHz samples resampled by FFmpeg (not by the resampler under test)."""
    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = SAMPLE_RATE
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
    frames = [*resampler.resample(frame), *resampler.resample(None)]
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype("<i2")


def detect(engine: VadEngine, pcm: bytes, rate: int = SAMPLE_RATE, state: bytes = b"") -> SpeechProbs:
    out: list[FromWorker] = []
    engine.submit(DetectSpeech(1, "test", pcm, rate, state))
    while engine.has_work():
        engine.step(out.append)
    (answer,) = out
    assert isinstance(answer, SpeechProbs), answer
    return answer


def streamed(engine: VadEngine, pcm: np.ndarray, rate: int, chunk_ms: int = 20) -> np.ndarray:
    """The probabilities of `pcm` sent as a realtime client sends it, `chunk_ms` at a time."""
    step = rate * chunk_ms // 1000
    state, probs = b"", []
    for i in range(0, len(pcm), step):
        answer = detect(engine, pcm[i : i + step].tobytes(), rate, state)
        probs.extend(answer.probs)
        state = answer.state
    return np.array(probs)


def test_speech_is_likely_and_silence_is_not(engine: VadEngine) -> None:
    pcm = clip()
    probs = np.array(detect(engine, pcm.tobytes()).probs)
    assert len(probs) == len(pcm) // WINDOW
    spoken, silence = probs[: len(speech()) // WINDOW], probs[-(SILENCE_S * 1000 // VAD_WINDOW_MS) + 2 :]
    # Five phrases with pauses between: a good third of the windows are confidently speech.
    assert (spoken > 0.9).mean() > 0.35 and spoken.max() > 0.98
    assert silence.max() < 0.1
    # "Ever tried." begins about 0.35 s in; the windows before it are silence.
    assert probs[:8].max() < 0.2 and probs[12:30].min() > 0.9


def test_a_clip_sent_in_20_ms_chunks_reads_as_the_clip_sent_whole(engine: VadEngine) -> None:
    pcm = clip()
    whole = np.array(detect(engine, pcm.tobytes()).probs)
    chunked = streamed(engine, pcm, SAMPLE_RATE)
    assert len(chunked) == len(whole)
    assert np.abs(chunked - whole).max() < 1e-3


@pytest.mark.parametrize("rate", [24_000, 48_000, 8_000])
def test_other_rates_are_resampled_to_16_khz(engine: VadEngine, rate: int) -> None:
    pcm = clip()
    reference = np.array(detect(engine, pcm.tobytes()).probs)
    other = at_rate(pcm, rate)
    whole = np.array(detect(engine, other.tobytes(), rate).probs)
    n = min(len(whole), len(reference))
    assert abs(len(whole) - len(reference)) <= 1
    # The same speech found at the same windows (8 kHz has lost what lies above 4 kHz).
    assert np.abs(whole[:n] - reference[:n]).mean() < (0.05 if rate == 8_000 else 0.02)
    assert ((whole[:n] > 0.5) == (reference[:n] > 0.5)).mean() > 0.95
    chunked = streamed(engine, other, rate)
    assert len(chunked) == len(whole) and np.abs(chunked - whole).max() < 1e-3


def test_the_resampler_keeps_a_tone_and_blocks_of_any_size_join() -> None:
    r = Resampler(24_000, 16_000)
    x = 0.5 * np.sin(2 * np.pi * 1000 * np.arange(24_000) / 24_000)
    history, position = r.start()
    whole, end, at = r(x, history, position)
    assert len(whole) < 16_000  # the filter's delay holds the last outputs back until more input comes
    whole = np.concatenate([whole, r.flush(end, at, len(x), len(whole))])
    assert len(whole) == 16_000
    expected = 0.5 * np.sin(2 * np.pi * 1000 * np.arange(16_000) / 16_000)  # the filter's delay is taken out
    assert np.abs(whole[200:-200] - expected[200:-200]).max() < 1e-3
    pieces, start = [], 0
    for size in (1, 2, 479, 480, 3000, 7, 20_031):
        out, history, position = r(x[start : start + size], history, position)
        pieces.append(out)
        start += size
    pieces.append(r.flush(history, position, len(x), sum(len(p) for p in pieces)))
    assert np.array_equal(np.concatenate(pieces), whole)
    # A tone above 8 kHz has no place at 16 kHz: it is filtered out, not folded down.
    alias, _, _ = r(0.5 * np.sin(2 * np.pi * 9000 * np.arange(24_000) / 24_000), *r.start())
    assert np.abs(alias[200:-200]).max() < 1e-3


def refusal(engine: VadEngine, pcm: bytes, rate: int = SAMPLE_RATE, state: bytes = b"") -> str:
    with pytest.raises(EngineError) as err:
        engine.submit(DetectSpeech(1, "test", pcm, rate, state))
    assert not engine.has_work()
    return err.value.message


def test_what_it_refuses(engine: VadEngine) -> None:
    assert "16000, 24000" in refusal(engine, b"\0\0", 44_100)
    assert "even number of bytes" in refusal(engine, b"\0\0\0")
    assert "at most 10 s" in refusal(engine, bytes(2 * 11 * SAMPLE_RATE))
    state = detect(engine, bytes(2 * 700), 24_000).state
    assert "24000 Hz" in refusal(engine, b"", SAMPLE_RATE, state)
    good = detect(engine, bytes(2 * 700)).state
    header = bytearray(good[: STATE_HEADER.size])
    header[8:10] = (600).to_bytes(2, "little")  # more pending samples than a window
    nan = bytearray(good)
    nan[STATE_HEADER.size : STATE_HEADER.size + 4] = np.float32(np.nan).tobytes()
    for garbage in (b"x", bytes(4096), good[:-4], good + b"\0\0\0\0", bytes(header) + good[STATE_HEADER.size :],
                    bytes(nan), b"VAD\x02" + good[4:]):  # fmt: skip
        assert "start the stream again" in refusal(engine, b"\0\0", SAMPLE_RATE, garbage)
    assert detect(engine, b"", SAMPLE_RATE, good).state == good  # no audio: the stream is where it was


def test_cancel_drops_a_queued_request_and_close_drops_the_rest(engine: VadEngine) -> None:
    out: list[FromWorker] = []
    for req_id in (1, 2, 3):
        engine.submit(DetectSpeech(req_id, "test", bytes(2 * WINDOW), SAMPLE_RATE))
    engine.cancel(1, out.append)
    engine.cancel(99, out.append)  # unknown: nothing
    assert out == [Done(1, "cancelled")]
    engine.step(out.append)
    assert isinstance(out[-1], SpeechProbs) and out[-1].req_id == 2 and len(out[-1].probs) == 1
    assert engine.has_work()
    engine.close()
    assert not engine.has_work()


def test_ready_says_what_it_is(engine: VadEngine) -> None:
    r = engine.ready()
    assert (r.engine, r.compute, r.provider) == ("vad", "cpu", "CPUExecutionProvider")
    assert r.model_bytes > 1_000_000 and "Silero VAD v6" in r.description
