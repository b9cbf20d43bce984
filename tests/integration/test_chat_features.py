"""Chat completeness through the real server and SDK: tools, grammars, JSON, reasoning,
logprobs, n and logit_bias. SmolLM2-135M is tiny, so most cases force the output with a
grammar: what is proven is the machinery (grammar, parsers, relay shapes), on the real engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                                                     "required": ["city"], "additionalProperties": False}}},
]  # fmt: skip
ASK = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 80}


def _error(exc: openai.APIStatusError) -> str:
    body = exc.body
    return body.get("error", "") if isinstance(body, dict) else str(body)


def _bad(client: openai.OpenAI, **kw: Any) -> str:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, **kw)
    return _error(info.value)


# ---- tools -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_forces_a_valid_call(client: openai.OpenAI, stream: bool) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                                     stream=True, **GREEDY))  # fmt: skip
        frags = [tc for ch in chunks for c in ch.choices for tc in (c.delta.tool_calls or [])]
        assert frags[0].id and frags[0].function.name == "get_weather" and frags[0].type == "function"
        assert len(frags) > 2, "arguments must stream in fragments, not one blob"
        args = "".join(f.function.arguments or "" for f in frags)
        finish = [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason]
        assert finish == ["tool_calls"]
    else:
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, **GREEDY)
        assert r.choices[0].finish_reason == "tool_calls"
        (call,) = r.choices[0].message.tool_calls
        assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
        args = call.function.arguments
    jsonschema.validate(json.loads(args), WEATHER_PARAMS)


def test_required_tool_choice_picks_one_of_the_tools(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "get_time")
    params = (
        TOOLS[0]["function"]["parameters"]
        if call.function.name == "get_weather"
        else TOOLS[1]["function"]["parameters"]
    )
    jsonschema.validate(json.loads(call.function.arguments), params)


def test_tool_call_stream_through_the_sdk_stream_helper(client: openai.OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    seen: list[str] = []
    with client.chat.completions.stream(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, **GREEDY) as s:
        for event in s:
            seen.append(event.type)
        final = s.get_final_completion()
    assert "tool_calls.function.arguments.delta" in seen
    assert "tool_calls.function.arguments.done" in seen
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


def test_tool_history_round_trips_through_the_template(client: openai.OpenAI) -> None:
    """An assistant call and its tool result reach the model (SmolLM2's template has no
    tool support, so the fallback renders them) and the conversation carries on."""
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius", "days": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sunny, 24 degrees"}'},
    ]  # fmt: skip
    with_result = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, **GREEDY)
    without = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, **GREEDY)
    assert with_result.usage.prompt_tokens > without.usage.prompt_tokens + 20
    assert with_result.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_none_renders_no_tools(client: openai.OpenAI) -> None:
    none = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1)
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens


def test_tool_choice_errors(client: openai.OpenAI) -> None:
    assert "tool_choice" in _bad(client, tool_choice="required")
    assert "no tool named" in _bad(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "tool_choice" in _bad(client, tools=TOOLS, tool_choice="sometimes")


# ---- structured output ---------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}  # fmt: skip
WHO = [{"role": "user", "content": "Describe a software engineer as JSON."}]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_response_validates(client: openai.OpenAI, stream: bool) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    kw: dict[str, Any] = {"model": MODEL, "messages": WHO, "response_format": fmt, "temperature": 0, "max_tokens": 120}
    if stream:
        text = "".join(
            c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices
        )
    else:
        r = client.chat.completions.create(**kw)
        assert r.choices[0].finish_reason == "stop"
        text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("how", ["response_format", "enable_json"])
def test_json_modes_give_a_json_object(client: openai.OpenAI, how: str) -> None:
    kw: dict[str, Any] = (
        {"response_format": {"type": "json_object"}}
        if how == "response_format"
        else {"extra_body": {"enable_json": True}}
    )
    r = client.chat.completions.create(model=MODEL, messages=WHO, temperature=0, max_tokens=60, **kw)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a JSON object's beginning, never prose
        assert r.choices[0].message.content.lstrip().startswith("{")


@pytest.mark.parametrize("stream", [False, True])
def test_grammar_string_allows_only_yes_or_no(client: openai.OpenAI, stream: bool) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Is the sky green?"}],
                          "extra_body": {"grammar_string": 'root ::= "yes" | "no"'}, "max_tokens": 10, "temperature": 0.9, "seed": 3}  # fmt: skip
    if stream:
        text = "".join(
            c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices
        )
    else:
        text = client.chat.completions.create(**kw).choices[0].message.content
    assert text in ("yes", "no")


def test_grammar_path_inside_the_allowed_folder(client: openai.OpenAI, grammar_dirs: tuple[Path, Path]) -> None:
    allowed, _ = grammar_dirs
    for path in ("yesno.gbnf", str(allowed / "yesno.gbnf")):
        r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, extra_body={"grammar_path": path})
        assert r.choices[0].message.content in ("yes", "no")


def test_grammar_path_outside_is_refused(client: openai.OpenAI, grammar_dirs: tuple[Path, Path]) -> None:
    allowed, outside = grammar_dirs
    for path in (str(outside / "secret.gbnf"), "../outside/secret.gbnf", str(allowed / ".." / "outside" / "secret.gbnf"),
                 "escape.gbnf", "/etc/passwd", "missing.gbnf"):  # fmt: skip
        message = _bad(client, extra_body={"grammar_path": path})
        assert "grammar_path" in message and "secret" not in message


def test_grammar_path_needs_an_operator_folder(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data")
    try:
        srv.wait_ready()
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": ASK, "grammar_path": "/etc/hostname"})  # fmt: skip
        assert r.status_code == 400 and "--grammar-dir" in r.json()["error"]
        assert srv.worker_pids() == [], "a refused request must not load a model"
    finally:
        srv.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_bad_grammar_is_a_400_with_the_parser_message(server: ServerProcess, stream: bool) -> None:
    body = {"model": MODEL, "messages": ASK, "stream": stream, "grammar_string": "root ::= undefined-rule"}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert "undefined-rule" in r.json()["error"]
    assert r.json()["error"].startswith("`grammar_string`: "), "the error names the request's own field"


def test_bad_schema_and_conflicts_are_400s(client: openai.OpenAI) -> None:
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}
    assert _bad(client, response_format=bad_schema).startswith("`response_format`: cannot turn this schema")
    assert "schema" in _bad(client, response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert "only one" in _bad(
        client, response_format={"type": "json_object"}, extra_body={"grammar_string": 'root ::= "a"'}
    )


# ---- reasoning -------------------------------------------------------------------

THINK = {"grammar_string": 'root ::= "<think>" "x" "</think>" "y"'}


@pytest.mark.parametrize("fmt", ["deepseek", "deepseek-legacy", "auto"])
def test_reasoning_split_non_streaming(client: openai.OpenAI, fmt: str) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=20,
                                       extra_body={**THINK, "reasoning_format": fmt})  # fmt: skip
    msg = r.choices[0].message
    assert msg.content == "y"
    assert msg.reasoning_content == "x"  # type: ignore[attr-defined]
    assert msg.reasoning == "x"  # type: ignore[attr-defined]


def test_reasoning_split_streaming(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=20, stream=True,
                                                 extra_body={**THINK, "reasoning_format": "deepseek"}))  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == ("x", "y")
    # The reasoning arrived before the content, in its own chunk.
    first_r = next(i for i, d in enumerate(deltas) if getattr(d, "reasoning_content", None))
    first_c = next(i for i, d in enumerate(deltas) if d.content)
    assert first_r < first_c


def test_reasoning_format_none_keeps_think_inline(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=20, extra_body=THINK)
    assert r.choices[0].message.content == "<think>x</think>y"
    assert getattr(r.choices[0].message, "reasoning_content", None) is None


# ---- reasoning budgets (gateway/chat/reasoning_budget.py, workers/engines/llama/think_budget.py) ------
# The thinking model is SmolLM2 under a template that opens `<think>` (tests/thinking_model.py): the
# answer starts inside a thinking section, which SmolLM2 fills with its story and never closes itself.

STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
CLOSE = "\n</think>\n\n"  # what the engine writes when the budget is spent


def budgeted(client: openai.OpenAI, model: str, budget: int, **kw: Any) -> Any:
    return client.chat.completions.create(model=model, messages=STORY, max_tokens=30, temperature=0, logprobs=True,
                                          extra_body={"thinking_budget_tokens": budget, "reasoning_format": "deepseek"},
                                          **kw)  # fmt: skip


@pytest.mark.parametrize("budget", [8, 9])
def test_a_reasoning_budget_closes_the_thinking_and_the_answer_follows(client: openai.OpenAI, thinking_model: str,
                                                                        budget: int) -> None:  # fmt: skip
    r = budgeted(client, thinking_model, budget)
    c = r.choices[0]
    tokens = [t.token for t in c.logprobs.content]
    # Exactly `budget` tokens of thinking, then the closing text as its own tokens, then the answer.
    assert c.message.reasoning_content == "".join(tokens[:budget]).strip()  # type: ignore[attr-defined]
    assert "</" not in "".join(tokens[:budget])
    n_close = next(n for n in range(1, 8) if "".join(tokens[budget : budget + n]) == CLOSE)
    assert c.message.content and c.message.content == "".join(tokens[budget + n_close :]).lstrip()
    assert r.usage.completion_tokens_details.reasoning_tokens == budget  # type: ignore[union-attr]
    assert r.usage.completion_tokens == len(tokens) == 30 and c.finish_reason == "length"  # max_tokens bounds all


def test_a_streamed_reasoning_budget_is_the_same_answer(client: openai.OpenAI, thinking_model: str) -> None:
    whole = budgeted(client, thinking_model, 8)
    chunks = list(budgeted(client, thinking_model, 8, stream=True, stream_options={"include_usage": True}))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == (whole.choices[0].message.reasoning_content, whole.choices[0].message.content)  # type: ignore[attr-defined]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens_details.reasoning_tokens == 8  # type: ignore[union-attr]


def test_without_a_budget_the_thinking_runs_on(client: openai.OpenAI, thinking_model: str) -> None:
    r = client.chat.completions.create(model=thinking_model, messages=STORY, max_tokens=30, temperature=0,
                                       extra_body={"reasoning_format": "deepseek"})  # fmt: skip
    assert r.choices[0].message.content == "" and r.usage.completion_tokens_details.reasoning_tokens == 30  # type: ignore[union-attr]
    # An effort is a budget too: `low` is 1024 tokens, beyond these 30.
    low = client.chat.completions.create(model=thinking_model, messages=STORY, max_tokens=30, temperature=0,
                                         reasoning_effort="low", extra_body={"reasoning_format": "deepseek"})  # fmt: skip
    assert low.choices[0].message.reasoning_content == r.choices[0].message.reasoning_content  # type: ignore[attr-defined]


@pytest.mark.parametrize("ask", [{"thinking_budget_tokens": 0}, {"reasoning_effort": "none"},
                                 {"reasoning_effort": "minimal"}])  # fmt: skip
def test_budget_zero_thinks_not_at_all(client: openai.OpenAI, thinking_model: str, ask: dict[str, Any]) -> None:
    r = client.chat.completions.create(model=thinking_model, messages=STORY, max_tokens=12, temperature=0,
                                       extra_body={**ask, "reasoning_format": "deepseek"})  # fmt: skip
    assert getattr(r.choices[0].message, "reasoning_content", None) is None and r.choices[0].message.content
    assert r.usage.completion_tokens_details is None  # no reasoning tokens to report


def test_each_choice_counts_its_own_budget(client: openai.OpenAI, thinking_model: str) -> None:
    r = client.chat.completions.create(model=thinking_model, messages=STORY, max_tokens=24, n=3, temperature=1.0,
                                       seed=7, extra_body={"thinking_budget_tokens": 5, "reasoning_format": "deepseek"})  # fmt: skip
    assert len(r.choices) == 3 and all(c.message.content for c in r.choices)
    assert r.usage.completion_tokens_details.reasoning_tokens == 3 * 5  # type: ignore[union-attr]


def test_a_budget_composes_with_speculation(client: openai.OpenAI, thinking_model: str) -> None:
    """A draft that guessed more thinking is dropped at the close; the output is the plain decode's."""
    plain = budgeted(client, thinking_model, 8)
    spec = client.chat.completions.create(model=thinking_model, messages=STORY, max_tokens=30, temperature=0,
                                          extra_body={"thinking_budget_tokens": 8, "reasoning_format": "deepseek",
                                                      "spec_type": "ngram-simple"})  # fmt: skip
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert spec.choices[0].message.reasoning_content == plain.choices[0].message.reasoning_content  # type: ignore[attr-defined]
    assert spec.usage.completion_tokens_details.reasoning_tokens == 8  # type: ignore[union-attr]


def test_a_grammar_is_not_interrupted_by_the_budget(client: openai.OpenAI) -> None:
    """Under a grammar the budget is not applied (the grammar shapes the whole output, and might refuse
    the closing text); its thinking is still counted."""
    grammar = 'root ::= "<think>" "a b c d e f g h" "</think>" "y"'
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                       extra_body={"grammar_string": grammar, "thinking_budget_tokens": 2,
                                                   "reasoning_format": "deepseek"})  # fmt: skip
    assert (r.choices[0].message.reasoning_content, r.choices[0].message.content) == ("a b c d e f g h", "y")  # type: ignore[attr-defined]
    assert r.usage.completion_tokens_details.reasoning_tokens > 2  # type: ignore[union-attr]


@pytest.mark.parametrize(("body", "field"), [({"thinking_budget_tokens": -2}, "thinking_budget_tokens"),
                                             ({"thinking_budget_tokens": 1.5}, "thinking_budget_tokens"),
                                             ({"thinking_budget_tokens": 10**9}, "thinking_budget_tokens"),
                                             ({"reasoning_effort": "extreme"}, "reasoning_effort")])  # fmt: skip
def test_a_bad_budget_is_a_400_naming_the_field(server: ServerProcess, body: dict[str, Any], field: str) -> None:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body}, timeout=30)
    assert r.status_code == 400 and f"`{field}`" in r.json()["error"]


# ---- logprobs, n, logit_bias, user -------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_agree_with_greedy_choice(client: openai.OpenAI, stream: bool) -> None:
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "temperature": 0,
        "max_tokens": 12,
        "logprobs": True,
        "top_logprobs": 5,
    }
    if stream:
        chunks = [c for c in client.chat.completions.create(stream=True, **kw) if c.choices]
        items = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
    else:
        r = client.chat.completions.create(**kw)
        items = r.choices[0].logprobs.content
        text = r.choices[0].message.content
        assert len(items) == r.usage.completion_tokens
    assert len(items) >= 10
    assert "".join(t.token for t in items) == text
    for t in items:
        assert len(t.top_logprobs) == 5
        assert t.logprob <= 0
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-5)
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True)
        assert bytes(t.bytes).decode() == t.token


def test_logprobs_errors(client: openai.OpenAI) -> None:
    assert "top_logprobs" in _bad(client, top_logprobs=3)
    assert "top_logprobs" in _bad(client, logprobs=True, top_logprobs=21)


@pytest.mark.parametrize("stream", [False, True])
def test_n_gives_independent_choices(client: openai.OpenAI, stream: bool) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": ASK, "n": 3, "max_tokens": 12, "temperature": 1.0, "seed": 11}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        texts = dict.fromkeys(range(3), "")
        finished = set()
        for c in chunks:
            for ch in c.choices:
                texts[ch.index] += ch.delta.content or ""
                if ch.finish_reason:
                    finished.add(ch.index)
        assert finished == {0, 1, 2}
        usage = chunks[-1].usage
    else:
        r = client.chat.completions.create(**kw)
        assert [c.index for c in r.choices] == [0, 1, 2]
        texts = {c.index: c.message.content for c in r.choices}
        usage = r.usage
    assert len(set(texts.values())) > 1, "seeded choices must differ"
    single = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    assert usage.prompt_tokens == single.usage.prompt_tokens  # the prompt is counted once
    assert usage.completion_tokens == usage.total_tokens - usage.prompt_tokens and usage.completion_tokens >= 3


def test_logit_bias_steers_the_sampler(client: openai.OpenAI) -> None:
    base = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=3, logprobs=True)
    first = base.choices[0].logprobs.content[0].token
    token_id = 1000
    biased = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=3, logprobs=True,
                                            logit_bias={str(token_id): 100})  # fmt: skip
    toks = [t.token for t in biased.choices[0].logprobs.content]
    assert len(toks) == 3 and len(set(toks)) == 1 and toks[0] != first
    assert "vocabulary" in _bad(client, logit_bias={"99999999": 5})
    assert "logit_bias" in _bad(client, logit_bias={"abc": 5})


def test_user_is_recorded_in_the_ledger(client: openai.OpenAI, server: ServerProcess) -> None:
    client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2, user="alice-42")
    rows = httpx.get(f"{server.base_url}/v1/usage", timeout=10).json()
    assert any(r.get("user") == "alice-42" for r in rows["data"])


def test_logprob_values_are_the_log_softmax_of_the_models_logits(client: openai.OpenAI, server: ServerProcess) -> None:
    """Each chosen token's logprob and its top alternatives equal the log-softmax of the row
    `/v1/logits` gives for the same ids (which equals llama.cpp's own, test_logits.py). The
    prompt is rendered here from the GGUF's own template, independently of the server."""
    import jinja2
    import llama_cpp
    import numpy as np

    from tests.integration.test_logits import gguf_path

    # Computed afresh, as /v1/logits computes: llama.cpp's CPU kernels are not batch-invariant, so a
    # prefix reused from an earlier, longer prompt's batch (the tool tests' system prompt) gives
    # logprobs up to ~0.15 away (measured), in llama-server as here.
    r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=8, logprobs=True,
                                       top_logprobs=5, extra_body={"cache_prompt": False})  # fmt: skip
    items = r.choices[0].logprobs.content
    assert len(items) == 8
    vocab = llama_cpp.Llama(model_path=gguf_path(), vocab_only=True, verbose=False)
    try:
        source = vocab.metadata["tokenizer.chat_template"]
        prompt = jinja2.Environment().from_string(source).render(messages=ASK, add_generation_prompt=True)
        ids = vocab.tokenize(prompt.encode(), add_bos=False, special=True)
        assert len(ids) == r.usage.prompt_tokens
        for item in items:
            got = httpx.post(f"{server.base_url}/v1/logits", json={"model": MODEL, "input_ids": ids, "last_only": True,
                                                                   "top_n": 0}, timeout=120)  # fmt: skip
            row = np.array(got.json()["rows"][0]["logits"], dtype=np.float64)
            logsoftmax = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
            chosen = int(row.argmax())  # greedy
            assert vocab.detokenize([chosen], special=True) == bytes(item.bytes)
            assert item.logprob == pytest.approx(logsoftmax[chosen], abs=0.01)
            top = np.argsort(-logsoftmax)[:5]
            assert [x.logprob for x in item.top_logprobs] == pytest.approx(list(logsoftmax[top]), abs=0.01)
            ids.append(chosen)
    finally:
        vocab.close()


def test_a_natural_stop_bills_exactly_the_tokens_of_the_answer(client: openai.OpenAI) -> None:
    """The end-of-generation token ends the answer; it is not part of it, nor of the bill."""
    for stream in (False, True):
        kw: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "temperature": 0,
                              "max_tokens": 200, "logprobs": True}  # fmt: skip
        if stream:
            chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
            items = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
            finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
            usage = chunks[-1].usage
        else:
            r = client.chat.completions.create(**kw)
            items, finish, usage = r.choices[0].logprobs.content, r.choices[0].finish_reason, r.usage
        assert finish == "stop"
        assert usage.completion_tokens == len(items) > 0
