"""Server VAD's turn taking and the sentence cutter of spoken answers: the rules, without models."""

from __future__ import annotations

from gateway.realtime.sentences import LONG_CHARS, Sentences
from gateway.realtime.turns import MIN_SPEECH_MS, Turn, TurnTaker
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
