"""The reasoning budget: the effort table, each dialect's field into the chat request's budget, the
bounds a budget is held to, the server's --reasoning-budget, and the engine's section tracker.
tests/integration/test_chat_features.py (and the dialects' modules) run it on the real model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway import cli
from gateway.chat.convert import plan_chat
from gateway.chat.reasoning_budget import EFFORT_TOKENS, budget_of, with_server_budget
from gateway.dialects.anthropic.translate import chat_request as anthropic_chat
from gateway.dialects.ollama.translate import chat_request as ollama_chat
from gateway.dialects.responses.translate import chat_request as responses_chat
from gateway.models.store import ModelStore
from gateway.ops.settings import out_of_bounds
from protocol import anthropic as a
from protocol import ollama as o
from protocol import responses as r
from protocol.chat import ChatRequest
from workers.engines.llama.think_budget import UNLIMITED, Section, ThinkBudget

HI = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatRequest:
    return msgspec.convert({"model": "m", "messages": HI, **fields}, ChatRequest)


def test_the_effort_table() -> None:
    assert EFFORT_TOKENS == {"none": 0, "minimal": 0, "low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768,
                             "max": -1}  # fmt: skip
    assert budget_of(chat(reasoning_effort="low")) == 1024
    assert budget_of(chat(reasoning_effort="minimal")) == 0
    assert budget_of(chat()) == UNLIMITED
    # An exact count wins over an effort.
    assert budget_of(chat(reasoning_effort="high", thinking_budget_tokens=8)) == 8
    assert budget_of(chat(thinking_budget_tokens=-1)) == UNLIMITED


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"thinking_budget_tokens": -2}, "thinking_budget_tokens"),
        ({"thinking_budget_tokens": 2.5}, "thinking_budget_tokens"),
        ({"thinking_budget_tokens": "8"}, "thinking_budget_tokens"),
        ({"thinking_budget_tokens": 1 << 21}, "thinking_budget_tokens"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"reasoning_effort": 3}, "reasoning_effort"),
    ],
)
def test_a_bad_budget_is_refused_naming_its_field(body: dict[str, Any], field: str) -> None:
    raw = msgspec.json.encode({"model": "m", "messages": HI, **body})
    with pytest.raises(msgspec.ValidationError, match=rf"`\$\.{field}`"):
        msgspec.json.decode(raw, type=ChatRequest)


def test_a_budget_beyond_max_tokens_is_fine() -> None:
    assert budget_of(chat(thinking_budget_tokens=4096, max_tokens=8)) == 4096


def test_the_server_budget_applies_only_where_the_request_has_none() -> None:
    assert with_server_budget(chat(), 8).thinking_budget_tokens == 8
    assert with_server_budget(chat(reasoning_effort="low"), 8).thinking_budget_tokens is None
    assert with_server_budget(chat(thinking_budget_tokens=100), 8).thinking_budget_tokens == 100
    assert with_server_budget(chat(), -1).thinking_budget_tokens is None


def test_the_plan_carries_the_budget_and_zero_tells_the_template_not_to_think(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, bundled=[])
    g = plan_chat(chat(thinking_budget_tokens=8), "t", store, []).generate
    assert g.reasoning_budget == 8 and g.template_vars["enable_thinking"] is True
    g = plan_chat(chat(reasoning_effort="none", enable_think=True), "t", store, []).generate
    assert g.reasoning_budget == 0 and g.template_vars["enable_thinking"] is False
    assert plan_chat(chat(), "t", store, []).generate.reasoning_budget == UNLIMITED


def test_anthropic_thinking_becomes_the_budget() -> None:
    def budget(thinking: dict[str, Any] | None) -> int | None:
        body: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": HI}
        if thinking is not None:
            body["thinking"] = thinking
        return anthropic_chat(msgspec.convert(body, a.MessagesRequest)).thinking_budget_tokens

    assert budget({"type": "enabled", "budget_tokens": 8}) == 8
    assert budget({"type": "disabled"}) == 0
    assert budget({"type": "adaptive"}) is None  # the server's
    assert budget(None) is None
    with pytest.raises(msgspec.ValidationError, match=r"`\$\.thinking\.budget_tokens`"):
        msgspec.json.decode(b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], '
                            b'"thinking": {"type": "enabled", "budget_tokens": -1}}', type=a.MessagesRequest)  # fmt: skip


def test_ollama_think_becomes_the_budget() -> None:
    def req(think: Any) -> ChatRequest:
        return ollama_chat(msgspec.convert({"model": "m", "messages": HI, "think": think}, o.OllamaChatRequest), None)

    assert (req(False).thinking_budget_tokens, req(False).enable_think) == (0, False)
    assert (req(True).thinking_budget_tokens, req(True).reasoning_effort) == (None, None)
    assert req("low").reasoning_effort == "low" and budget_of(req("high")) == 16384
    with pytest.raises(msgspec.ValidationError, match=r"`\$\.think`"):
        msgspec.json.decode(b'{"model": "m", "messages": [], "think": "extreme"}', type=o.OllamaChatRequest)


def test_responses_effort_and_exact_budget() -> None:
    def req(**fields: Any) -> ChatRequest:
        return responses_chat(msgspec.convert({"model": "m", "input": "hi", **fields}, r.ResponsesRequest), []).request

    assert budget_of(req(reasoning={"effort": "medium"})) == 4096
    assert budget_of(req(reasoning={"effort": "none"})) == 0
    assert budget_of(req(reasoning={"effort": "high"}, thinking_budget_tokens=8)) == 8
    assert budget_of(req()) == UNLIMITED
    with pytest.raises(msgspec.ValidationError, match=r"`\$\.thinking_budget_tokens`"):
        msgspec.json.decode(b'{"model": "m", "input": "hi", "thinking_budget_tokens": -5}', type=r.ResponsesRequest)


def test_the_flag_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.settings_from(cli.serve_parser().parse_args([])).reasoning_budget == -1  # unlimited by default
    assert cli.settings_from(cli.serve_parser().parse_args(["--reasoning-budget", "8"])).reasoning_budget == 8
    monkeypatch.setenv("GENIEX_REASONING_BUDGET", "0")
    p = cli.serve_parser()
    cli._env_defaults(p)
    assert p.parse_args([]).reasoning_budget == 0
    bad = cli.settings_from(cli.serve_parser().parse_args(["--reasoning-budget", "-2"]))
    assert out_of_bounds(bad) == ["--reasoning-budget must be -1..1048576, not -2"]


# ---- the engine's tracker -------------------------------------------------------


def feed(t: ThinkBudget, *pieces: str) -> list[bool]:
    return [t.feed(p) for p in pieces]


def test_a_section_the_prompt_opened_is_cut_at_its_budget() -> None:
    t = ThinkBudget(3, opened=True)
    assert feed(t, "Let", " me", " see") == [False, False, True]
    assert t.tokens == 3 and t.spent
    assert t.closing() == "\n</think>\n\n" and t.state is Section.CLOSED and not t.spent
    assert feed(t, "4") == [False] and t.tokens == 3  # the answer is not counted


def test_a_section_the_model_opens_counts_from_after_its_tag() -> None:
    t = ThinkBudget(2, opened=False)
    assert feed(t, "\n", "<", "think", ">", "a") == [False, False, False, False, False]
    assert t.state is Section.OPEN and t.tokens == 1
    assert feed(t, "b") == [True]
    zero = ThinkBudget(0, opened=False)  # budget 0: closed the moment it opens
    assert feed(zero, "<thinking>") == [True] and zero.closing() == "\n</thinking>\n\n"


def test_a_closing_tag_split_across_tokens_ends_the_section() -> None:
    t = ThinkBudget(UNLIMITED, opened=True)
    feed(t, "hm", "</", "think", ">", "\n\n", "Four")
    assert t.state is Section.CLOSED and t.tokens == 3  # "hm", "</", "think"; ">" completed the tag
    assert not t.spent


def test_output_that_opens_no_section_counts_nothing() -> None:
    t = ThinkBudget(1, opened=False)
    assert feed(t, " ", "Hello", " <think>", " there") == [False] * 4
    assert t.state is Section.CLOSED and t.tokens == 0
