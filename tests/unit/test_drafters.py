"""The n-gram drafters over plain token lists."""

from __future__ import annotations

import random

import pytest

from workers.engines.llama.drafters import NgramMapK, NgramSimple, make_drafter

KINDS = ["ngram-simple", "ngram-map-k"]


@pytest.mark.parametrize("kind", KINDS)
def test_no_draft_without_an_earlier_occurrence(kind: str) -> None:
    d = make_drafter(kind)
    assert d.draft([], 3) == []
    assert d.draft([1], 3) == []
    assert d.draft([1, 2, 3, 4, 5, 6], 3) == []


@pytest.mark.parametrize("kind", KINDS)
def test_drafts_what_followed_the_earlier_occurrence(kind: str) -> None:
    d = make_drafter(kind)
    history = [7, 1, 2, 3, 4, 5, 9, 9, 1, 2, 3]
    assert d.draft(history, 2) == [4, 5]
    assert d.draft(history, 3) == [4, 5, 9]


@pytest.mark.parametrize("kind", KINDS)
def test_the_most_recent_occurrence_wins(kind: str) -> None:
    d = make_drafter(kind)
    history = [1, 2, 3, 10, 0, 1, 2, 3, 20, 0, 1, 2, 3]
    assert d.draft(history, 1) == [20]


@pytest.mark.parametrize("kind", KINDS)
def test_incremental_use_matches_a_fresh_drafter(kind: str) -> None:
    """A drafter is fed a growing history step by step; its index must stay exact."""
    rng = random.Random(5)
    history: list[int] = []
    live = make_drafter(kind)
    for _ in range(400):
        history.extend(rng.choice([[1, 2], [3], [1, 2, 3, 4], [5, 1]]))
        assert live.draft(history, 4) == make_drafter(kind).draft(history, 4)


@pytest.mark.parametrize("kind", KINDS)
def test_draft_never_exceeds_n_max(kind: str) -> None:
    history = [1, 2, 3, 4] * 20
    for n in (1, 2, 5, 16):
        assert len(make_drafter(kind).draft(history, n)) <= n


def test_simple_prefers_the_longest_match() -> None:
    # The last 2 tokens (3, 4) occur most recently before 8, but the last 4 (1, 2, 3, 4) only before 6.
    history = [1, 2, 3, 4, 6, 0, 3, 4, 8, 0, 1, 2, 3, 4]
    assert NgramSimple().draft(history, 1) == [6]
    assert NgramSimple(longest=2, shortest=2).draft(history, 1) == [8]


def test_simple_ignores_matches_across_token_boundaries() -> None:
    # Packed as little-endian int32, [256, 0, 0] is 00 01 00 00 | 00 00 00 00 | 00 ..., which holds
    # the bytes of (1, 0) = 01 00 00 00 | 00 00 00 00 at offset 1: not a token match.
    history = [256, 0, 0, 9, 1, 0]
    assert NgramSimple(longest=2, shortest=2).draft(history, 2) == []
    # With a real, aligned occurrence further back, that one is found.
    history = [1, 0, 5, 256, 0, 0, 9, 1, 0]
    assert NgramSimple(longest=2, shortest=2).draft(history, 2) == [5, 256]


def test_simple_stops_at_the_end_of_history() -> None:
    # period 3: the latest earlier occurrence of (2, 3) is followed by only what the history holds
    history = [1, 2, 3, 1, 2, 3]
    assert NgramSimple(shortest=2).draft(history, 8) == [1, 2, 3]


def test_map_k_follows_the_map_past_the_end_of_history() -> None:
    history = [1, 2, 3, 1, 2, 3]
    assert NgramMapK(k=3).draft(history, 8) == [1, 2, 3, 1, 2, 3, 1, 2]


def test_map_k_key_length() -> None:
    history = [5, 1, 2, 3, 9, 4, 2, 3]
    assert NgramMapK(k=2).draft(history, 1) == [9]  # (2, 3) seen before
    assert NgramMapK(k=3).draft(history, 1) == []  # (4, 2, 3) never seen before


def test_history_can_be_any_int_sequence() -> None:
    assert NgramSimple(shortest=2).draft((1, 2, 3, 1, 2), 1) == [3]
    assert NgramMapK(k=2).draft((1, 2, 3, 1, 2), 1) == [3]
