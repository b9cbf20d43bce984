"""`truncation: "auto"`'s policy (protocol/overflow.py): which messages may go, in which order, and
how many must go; and the gateway's bound on the text it lets through (prompt_chars)."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from litestar.exceptions import ValidationException

from gateway.chat.convert import prompt_chars
from gateway.http.body import read_json
from protocol import overflow
from protocol.chat import ChatMessage, ChatRequest
from protocol.overflow import budget, fit, groups, kept, least_k
from protocol.wire import Generate, ImageInput, Started
from workers.engines.llama.truncation import Reports, truncate


def roles(text: str) -> list[str]:
    """`"s u a t"` -> the roles: s system, d developer, u user, a assistant, t tool."""
    names = {"s": "system", "d": "developer", "u": "user", "a": "assistant", "t": "tool"}
    return [names[c] for c in text.split()]


def test_the_system_prompt_and_the_last_user_message_stay_and_whole_turns_go_oldest_first() -> None:
    assert groups(roles("s u a u a u")) == [range(1, 3), range(3, 5)]
    assert groups(roles("s d u a u")) == [range(2, 4)]  # the leading system and developer messages are pinned
    assert groups(roles("u")) == []
    assert groups(roles("s u")) == []
    assert groups(roles("a u a u")) == [range(1), range(1, 3)]  # a leading assistant turn goes first


def test_a_tool_call_goes_with_its_results() -> None:
    # Before the last user message, a turn holds its calls and their results.
    assert groups(roles("s u a t t a u")) == [range(1, 6)]
    # After it (an agent's loop), each call goes with its results, and the latest round stays.
    assert groups(roles("s u a t a t t a t")) == [range(2, 4), range(4, 7)]
    assert groups(roles("s u a t u a t a t")) == [range(1, 4), range(5, 7)]


def test_what_stays_never_holds_an_orphan_result_or_a_call_without_its_results() -> None:
    """Any conversation, any number of groups dropped: the pinned prefix and the last user message
    stay, a kept tool result's call stays, a kept call's results stay, and what follows the pinned
    prefix starts with a user message (strict templates want user / assistant turns)."""
    rng = random.Random(7)
    for _ in range(500):
        rs = [rng.choice(["system", "developer"]) for _ in range(rng.randint(0, 2))]
        for _ in range(rng.randint(1, 8)):
            rs.append("user")
            for _ in range(rng.randint(0, 3)):
                rs.append("assistant")
                rs.extend(["tool"] * rng.randint(0, 2))
        drop = groups(rs)
        owner = {}  # each tool result's call: the last non-tool message before it
        for i, r in enumerate(rs):
            if r == "tool":
                owner[i] = next(j for j in range(i - 1, -1, -1) if rs[j] != "tool")
        pinned = next((i for i, r in enumerate(rs) if r not in ("system", "developer")), len(rs))
        last_user = max(i for i, r in enumerate(rs) if r == "user")
        for k in range(len(drop) + 1):
            keep = kept(len(rs), drop, k)
            assert keep[:pinned] == list(range(pinned)) and last_user in keep and len(rs) - 1 in keep
            for i in keep:
                if rs[i] == "tool":
                    assert owner[i] in keep, (rs, k)
            for i, j in owner.items():
                assert (i in keep) == (j in keep), (rs, k)
            if k and len(keep) > pinned:
                assert rs[keep[pinned]] == "user", (rs, k)


def test_the_budget_keeps_room_for_the_answer() -> None:
    assert budget(256, 8) == 248  # max_tokens
    assert budget(256, None) == 192  # a quarter when the request sets none
    assert budget(256, 10_000) == 192  # at most a quarter
    assert budget(2, None) == 1  # at least one token


def test_fit_drops_the_fewest_groups_that_fit() -> None:
    sizes = [100, 40, 40, 40, 40, 10]  # the prompt's tokens with k groups dropped: 270 - 40k
    measured: list[int] = []

    def measure(k: int) -> int:
        measured.append(k)
        return sum(sizes) - 40 * k

    assert fit(4, measure, 200) == 2 and len(measured) <= 4
    assert fit(4, lambda k: 500, 200) == 4  # nothing is enough: every group goes
    assert fit(4, measure, 10_000, lo=3) == 3  # never fewer than `lo`


def test_least_k_is_a_lower_bound_from_the_text_alone() -> None:
    drop = [range(1, 2), range(2, 3), range(3, 4)]
    assert least_k([10, 50, 50, 50, 5], drop, 1000) == 0
    assert least_k([10, 50, 50, 50, 5], drop, 70) == 2
    assert least_k([10, 50, 50, 50, 5], drop, 64) == 3
    assert least_k([10, 50, 50, 50, 5], drop, 5) == 3  # even all of them: every group


def test_message_chars_and_images() -> None:
    m: dict[str, Any] = {
        "role": "assistant",
        "content": [{"type": "text", "text": "abc"}, {"type": "image"}, {"type": "image"}],
        "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
    }
    assert overflow.message_chars(m) == 3 + 8 and overflow.image_parts(m) == 2
    assert overflow.message_chars({"role": "user", "content": "hello"}) == 5
    assert overflow.image_parts({"role": "user", "content": "hello"}) == 0


def test_the_gateway_bounds_only_the_text_that_cannot_be_dropped() -> None:
    long, short = "x" * 1000, "hi"
    msgs = [ChatMessage(role="system", content=short), ChatMessage(role="user", content=long),
            ChatMessage(role="assistant", content=long), ChatMessage(role="user", content=short)]  # fmt: skip
    assert prompt_chars(msgs) == 2004
    assert prompt_chars(msgs, "auto") == 4


@pytest.mark.parametrize("value", ["Auto", "sometimes", "", 1, True])
def test_a_truncation_other_than_the_two_names_the_field_and_the_values(value: object) -> None:
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}], "truncation": value})
    with pytest.raises(ValidationException) as e:
        read_json(body, ChatRequest)
    detail = e.value.extra[0]  # type: ignore[index]
    assert detail["key"] == "truncation" and "(one of `auto`, `disabled`)" in detail["message"], detail


class FakeMedia:
    """Stands for a tokenized prompt's images: only whether it was freed matters here."""

    def __init__(self) -> None:
        self.freed = False

    def free(self) -> None:
        self.freed = True


def test_the_worker_runs_the_first_candidate_that_fits_with_its_own_images_and_frees_the_rest() -> None:
    a, b, c = (ImageInput(1, 1, bytes([i, i, i])) for i in range(3))
    image = {"type": "image"}

    def user(text: str, images: int = 0) -> dict[str, Any]:
        return {"role": "user", "content": [*[image] * images, {"type": "text", "text": text}]}

    messages = [{"role": "system", "content": "s"}, user("x" * 39, 1), {"role": "assistant", "content": "x" * 40},
                *[m for _ in range(2) for m in (user("x" * 40), {"role": "assistant", "content": "x" * 40})],
                user("x" * 38, 2), {"role": "assistant", "content": "x" * 40}, user("q")]  # fmt: skip
    made: list[tuple[FakeMedia, list[ImageInput]]] = []

    def tokenize(kept: list[dict[str, Any]], images: list[ImageInput]) -> Any:
        media = FakeMedia()
        made.append((media, images))
        return [0] * sum(overflow.message_chars(m) + overflow.image_parts(m) for m in kept), False, media

    req = Generate(req_id=1, log_id="r", messages=messages, max_tokens=8, images=[a, b, c], truncation="auto")
    full = FakeMedia()
    # 322 tokens, 80 a turn; a context of 200 less 8 for the answer: two turns must go.
    (tokens, _, media), dropped = truncate(req, ([0] * 322, False, full), 200, tokenize)  # type: ignore[arg-type]
    assert dropped is not None and (dropped.messages, dropped.tokens) == (4, 160) and len(tokens) == 162
    chosen = next(i for m, i in made if m is media)
    assert chosen == [b, c]  # the first turn's image went with it
    assert full.freed and not media.freed and all(m.freed for m, _ in made if m is not media)  # type: ignore[union-attr]

    # The counts go to the gateway in the request's Started, and only in its own.
    reports, sent = Reports(), []
    reports.pending[1] = dropped
    emit = reports.emit(sent.append)
    emit(Started(2, 5))
    emit(Started(1, 162))
    assert [(m.req_id, m.dropped_messages, m.dropped_tokens) for m in sent] == [(2, 0, 0), (1, 4, 160)]
    assert not reports.pending
