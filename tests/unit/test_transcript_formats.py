"""srt, vtt and verbose_json from a Transcript: timestamps, cue order, and the clamping of the
rare segment whose times Whisper gets wrong (synthetic Transcripts, to reach those cases)."""

from __future__ import annotations

import itertools
import re

from gateway.dialects.openai.transcript_formats import as_json, as_verbose, cues, srt, text_of, timestamp, vtt
from protocol.wire import Transcript, TranscriptSegment, TranscriptWord


def seg(i: int, start: float, end: float, text: str) -> TranscriptSegment:
    return TranscriptSegment(i, 0, start, end, text, [1, 2], 0.0, -0.2, 1.1, 0.01)


T = Transcript(1, "en", 12.0, [seg(0, 0.0, 4.25, " Ever tried."), seg(1, 4.25, 9.5, " Fail better.")])


def test_timestamps_round_to_the_millisecond_and_carry() -> None:
    assert timestamp(0, ",") == "00:00:00,000"
    assert timestamp(3661.0004, ",") == "01:01:01,000"
    assert timestamp(59.9996, ".") == "00:01:00.000"  # rounding carries into the minutes
    assert timestamp(-0.5, ",") == "00:00:00,000"
    assert timestamp(100 * 3600 + 1.5, ",") == "100:00:01,500"


def test_srt_numbers_its_cues_with_comma_times() -> None:
    assert srt(T) == ("1\n00:00:00,000 --> 00:00:04,250\nEver tried.\n\n"
                      "2\n00:00:04,250 --> 00:00:09,500\nFail better.\n")  # fmt: skip


def test_vtt_has_its_header_and_dot_times() -> None:
    assert (
        vtt(T)
        == "WEBVTT\n\n00:00:00.000 --> 00:00:04.250\nEver tried.\n\n00:00:04.250 --> 00:00:09.500\nFail better.\n"
    )


def test_cues_are_clamped_monotonic_and_inside_the_audio() -> None:
    bad = Transcript(1, "en", 10.0, [seg(0, 2.0, 5.0, " a"), seg(1, 1.0, 0.5, " b"), seg(2, 9.0, 11.0, " c"),
                                     seg(3, 12.0, 13.0, " d"), seg(4, 5.0, 6.0, "  ")])  # fmt: skip
    out = cues(bad)
    assert [c.text for c in out] == ["a", "b", "c", "d"]  # an empty segment makes no cue
    for c, nxt in itertools.pairwise(out):
        assert c.start <= nxt.start
    assert all(0 <= c.start <= c.end <= 10.0 for c in out)


def test_cue_text_cannot_end_a_cue_early_or_fake_a_timing_line() -> None:
    t = Transcript(1, "en", 5.0, [seg(0, 0.0, 2.0, " one\n\ntwo --> three")])
    body = vtt(t)
    assert body.count("-->") == 1
    assert re.search(r"one\ntwo -> three\n$", body)


def test_json_and_verbose_json_shapes() -> None:
    assert text_of(T) == "Ever tried. Fail better."
    assert as_json(T).usage.seconds == 12.0
    words = Transcript(1, "en", 12.0, T.segments, [TranscriptWord(" Ever", 0.0, 0.4, 0.9)])
    verbose = as_verbose(words, words=True)
    assert verbose.language == "english" and verbose.task == "transcribe"
    assert verbose.words is not None and verbose.words[0].word == "Ever"
    assert as_verbose(words, words=False).words is None
