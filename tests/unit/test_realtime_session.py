"""Server VAD's turn taking, the sentence cutter of spoken answers and a session's close: without models."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from gateway.dialects.realtime.config import SessionSettings
from gateway.dialects.realtime.sentences import LONG_CHARS, Sentences
from gateway.dialects.realtime.session import RealtimeSession
from gateway.dialects.realtime.turns import MIN_SPEECH_MS, Turn, TurnTaker
from protocol.wire import VAD_WINDOW_MS

W = VAD_WINDOW_MS


def test_speech_starts_after_the_least_run_and_stops_after_the_silence() -> None:
    t = TurnTaker(threshold=0.5, silence_duration_ms=W * 5)
    assert t.feed([0.1] * 10) == []
    assert t.feed([0.9] * (MIN_SPEECH_MS // W - 1)) == []  # too short yet
    assert t.feed([0.9]) == [Turn("started", 10 * W)]
    assert t.feed([0.9] * 20 + [0.1] * 4) == []  # a pause shorter than the silence
    assert t.feed([0.9] * 3 + [0.1] * 5) == [Turn("stopped", (10 + 3 + 20 + 4 + 3) * W)]
    assert not t.speaking


def test_a_click_never_starts_speech_and_a_soft_syllable_never_ends_it() -> None:
    t = TurnTaker(threshold=0.5, silence_duration_ms=W * 3)
    assert t.feed([0.9, 0.9, 0.1, 0.9, 0.1]) == []  # runs shorter than MIN_SPEECH_MS
    assert [x.kind for x in t.feed([0.9] * 4)] == ["started"]
    assert t.feed([0.4, 0.4, 0.4, 0.4]) == []  # above threshold - hysteresis: still speech
    assert [x.kind for x in t.feed([0.2] * 3)] == ["stopped"]


def test_a_turn_cut_at_its_bound_ends_where_the_audio_is() -> None:
    t = TurnTaker()
    assert t.cut() is None
    t.feed([0.9] * 10)
    assert t.cut() == Turn("stopped", 10 * W) and not t.speaking


def test_sentences_come_out_as_soon_as_they_end() -> None:
    s = Sentences()
    assert s.feed("The capital of Fra") == []
    assert s.feed("nce is Paris. It is") == ["The capital of France is Paris."]
    assert s.feed(" big! Is it? Yes") == ["It is big!", "Is it?"]
    assert s.feed("\n\nNext line") == ["Yes"]
    assert s.rest() == "Next line" and s.rest() == ""
    assert s.feed('He said "go." Then') == ['He said "go."']
    assert s.feed("3.5 percent") == []  # a decimal point is no sentence end


def test_a_long_run_without_an_end_is_cut_at_a_clause() -> None:
    s = Sentences()
    text = "word, " * (LONG_CHARS // 6 + 5)
    out = s.feed(text)
    assert out and all(len(x) <= LONG_CHARS for x in out) and out[0].endswith(",")


async def test_a_session_closes_even_when_a_task_loses_its_cancellation() -> None:
    """Python 3.11's wait_for can drop a cancellation that meets an answer: a task that goes on
    waiting for audio must still end when the session closes."""

    async def send(_: str) -> None:
        pass

    services = cast(Any, SimpleNamespace(settings=SimpleNamespace(realtime_max_session_s=60.0)))
    settings = SessionSettings(id="s", kind="realtime", chat_model="m", transcriber="w", vad_model="v",
                               voice_model="p", turn_detection=None)  # fmt: skip
    session = RealtimeSession(services, settings, send, "caller", "", "log")

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # the cancellation lost, as wait_for may lose it
        await session.vad_audio.get()  # then waits for audio, as the VAD loop does

    session.vad_task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(session.close(), 10)
    assert session.vad_task.done()
