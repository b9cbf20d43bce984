"""gateway.chat.reasoning on recorded-style outputs: each case whole, in every two-piece split, one character at a
time and in seeded random chunks, streamed pieces joining to split_reasoning's answer."""

from __future__ import annotations

import pytest

from gateway.chat.reasoning import (
    SPLIT_FORMATS,
    ReasoningSplitter,
    split_reasoning,
    splits_reasoning,
)
from tests.splits import chunkings as split_ways


def chunkings(text: str) -> list[list[str]]:
    return split_ways(text, max_piece=9)


def split(text: str, *, starts_in_reasoning: bool = False) -> tuple[str, str]:
    """split_reasoning, after checking every split of `text` streams to the same result."""
    expected = split_reasoning(text, starts_in_reasoning=starts_in_reasoning)
    for fmt in SPLIT_FORMATS:
        assert split_reasoning(text, starts_in_reasoning=starts_in_reasoning, reasoning_format=fmt) == expected
    for pieces in chunkings(text):
        s = ReasoningSplitter(starts_in_reasoning=starts_in_reasoning)
        outs = [s.feed(p) for p in pieces] + [s.finish()]
        assert ("".join(r for r, _ in outs), "".join(c for _, c in outs)) == expected, pieces
    return expected


def test_the_simplest_case() -> None:
    assert split("<think>x</think>y") == ("x", "y")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # DeepSeek-R1 / Qwen3 style
        (
            "<think>\nThe user asks for 2+2. That is 4.\n</think>\n\n2 + 2 = **4**.",
            ("The user asks for 2+2. That is 4.", "2 + 2 = **4**."),
        ),
        (
            "<think>\nFirst, list the facts.\n\nThen answer.\n\n</think>\n\nParis is the capital.\n",
            ("First, list the facts.\n\nThen answer.", "Paris is the capital.\n"),
        ),
        ("\n <think>\n\n</think>\n\nHello! How can I help?", ("", "Hello! How can I help?")),
        ("<think>Unfinished thought, cut by max_tokens  \n", ("Unfinished thought, cut by max_tokens", "")),
        (
            "<think>a < b and </th> and </thinking> are text</think>ok",
            ("a < b and </th> and </thinking> are text", "ok"),
        ),
        ("<think>x</think>y <think>not reasoning</think>", ("x", "y <think>not reasoning</think>")),
        ("<thinking>\nshort\n</thinking>\nAnswer", ("short", "Answer")),
        ("<think>partial close at the end </thin", ("partial close at the end </thin", "")),
        # no reasoning: content unchanged
        ("Plain answer with <think> in the middle.", ("", "Plain answer with <think> in the middle.")),
        ("  \n leading space kept, a < b, <b>bold</b>\n", ("", "  \n leading space kept, a < b, <b>bold</b>\n")),
        ("", ("", "")),
        ("   ", ("", "   ")),
        ("<thin", ("", "<thin")),
        ("<|chan", ("", "<|chan")),
        ("Emoji 🌊 and — dashes…", ("", "Emoji 🌊 and — dashes…")),
        # gpt-oss harmony
        (
            (
                "<|channel|>analysis<|message|>User says hi. Respond friendly.<|end|>"
                "<|start|>assistant<|channel|>final<|message|>Hello! 👋 How can I help?<|return|>"
            ),
            ("User says hi. Respond friendly.", "Hello! 👋 How can I help?"),
        ),
        (
            (
                "<|start|>assistant<|channel|>analysis<|message|>Compute 6*7 = 42.<|end|>"
                "<|start|>assistant<|channel|>final<|message|>42<|end|>"
            ),
            ("Compute 6*7 = 42.", "42"),
        ),
        ("<|channel|>final<|message|>Only the answer.<|return|>", ("", "Only the answer.")),
        ("<|start|>assistant<|channel|>final<|message|>Only the answer.", ("", "Only the answer.")),
        ("<|channel|>analysis<|message|>Still thinking when cut", ("Still thinking when cut", "")),
        (
            (
                "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'
            ),
            ("Need the weather.", '{"city": "Oslo"}'),
        ),
        (
            (
                "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>"
                "<|start|>assistant<|channel|>final<|message|>Done"
            ),
            ("One.\nTwo.", "Done"),
        ),
        ("Outside text <|channel|>final<|message|>inside", ("", "Outside text \ninside")),
    ],
)
def test_cases(text: str, expected: tuple[str, str]) -> None:
    assert split(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Okay, the user wants a haiku.\n</think>\n\nAutumn wind...",
            ("Okay, the user wants a haiku.", "Autumn wind..."),
        ),
        ("<think>\nRepeated tag.\n</think>\nA", ("Repeated tag.", "A")),
        ("Never closed", ("Never closed", "")),
        ("\n\n</think>\n\nJust the answer", ("", "Just the answer")),
        ("Mentions <think> later</think>x", ("Mentions <think> later", "x")),
    ],
)
def test_starts_in_reasoning(text: str, expected: tuple[str, str]) -> None:
    assert split(text, starts_in_reasoning=True) == expected


def test_reasoning_streams_before_the_closing_tag() -> None:
    s = ReasoningSplitter()
    assert s.feed("<think>") == ("", "")
    assert s.feed("\nThe user") == ("The user", "")
    assert s.feed(" wants a") == (" wants a", "")  # released token by token
    assert s.feed(" haiku.\n") == (" haiku.", "")  # trailing whitespace waits: it may end the reasoning
    assert s.feed("</thi") == ("", "")  # a possible closing tag is held
    assert s.feed("nk>\n\nAutumn") == ("", "Autumn")
    assert s.feed(" wind") == ("", " wind")
    assert s.finish() == ("", "")


def test_held_marker_start_is_released_when_it_fails() -> None:
    s = ReasoningSplitter()
    assert s.feed("<think>a </th") == ("a", "")
    assert s.feed("x more") == (" </thx more", "")
    assert s.feed(" </think") == ("", "")
    assert s.finish() == (" </think", "")


def test_content_without_markers_flows_at_once() -> None:
    s = ReasoningSplitter()
    assert s.feed("Hello") == ("", "Hello")
    assert s.feed(" there") == ("", " there")
    assert s.feed(" <") == ("", " ")  # `<` may begin a harmony marker
    assert s.feed("b>") == ("", "<b>")


def test_harmony_streams() -> None:
    s = ReasoningSplitter()
    assert s.feed("<|channel|>analysis<|message|>Think") == ("Think", "")
    assert s.feed("ing hard") == ("ing hard", "")
    assert s.feed("<|end|><|start|>assistant<|channel|>final<|message|>An") == ("", "An")
    assert s.feed("swer<|return|>") == ("", "swer")
    assert s.finish() == ("", "")


def test_formats() -> None:
    assert all(splits_reasoning(f) for f in ("deepseek", "deepseek-legacy", "auto"))
    assert not splits_reasoning("none") and not splits_reasoning(None)
    with pytest.raises(ValueError):
        ReasoningSplitter(reasoning_format="none")
