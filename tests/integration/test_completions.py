"""/v1/completions through the real SDK: text_completion shape, streaming, echo, stop, n,
several prompts, legacy logprobs, and `suffix` refused for a model without FIM tokens."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import MODEL

PROMPT = "The capital of France is"


def test_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    (choice,) = r.choices
    assert choice.index == 0 and choice.text and choice.finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens >= 5
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 16


def test_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=20)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=20, stream=True,
                                            stream_options={"include_usage": True}))  # fmt: skip
    assert all(c.object == "text_completion" for c in chunks)
    text = "".join(ch.text for c in chunks for ch in c.choices)
    assert text == whole.choices[0].text
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == [
        whole.choices[0].finish_reason
    ]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_echo_stop_and_several_prompts(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8, echo=True)
    assert r.choices[0].text.startswith(PROMPT) and len(r.choices[0].text) > len(PROMPT)
    plain = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=30).choices[0].text
    cut = plain.strip()[:3]
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=30, stop=[cut])
    assert cut not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"
    two = client.completions.create(model=MODEL, prompt=[PROMPT, "1, 2, 3, 4,"], temperature=0, max_tokens=6)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[0].text != two.choices[1].text
    one = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=6)
    assert two.choices[1].text == one.choices[0].text
    assert two.usage.prompt_tokens == r.usage.prompt_tokens + one.usage.prompt_tokens


def test_n_and_legacy_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, n=2, temperature=0, logprobs=3)
    assert [c.index for c in r.choices] == [0, 1]
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert (
            len(top) == 3
            and max(top.values()) == pytest.approx(value, abs=1e-5)
            and top[tok] == pytest.approx(value, abs=1e-5)
        )


def test_errors(client: openai.OpenAI) -> None:
    for kw in ({"suffix": "return x"}, {"prompt": []}, {"max_tokens": 0}, {"logprobs": 9}):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(**{"model": MODEL, "prompt": PROMPT, **kw})
        assert info.value.body  # the SDK hands over our `error` string
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=PROMPT, suffix="x")
    assert "fill-in-the-middle" in str(info.value.body)
