"""Automatic prompt caching on the real engine: reuse without a header, the same greedy answers,
isolation by cache_salt, nothing kept from a cancelled turn, states that outlive their slot in
the RAM cache, and the RAM cap."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from tests.conftest import MODEL
from tests.integration.test_lifecycle import client_for, workers

# A system prompt long enough that reusing it shows (about 220 tokens with SmolLM2's template; at
# 1,000 the module's prefills took a fifth of the suite's time, and at 330 they were still most of
# this module's). Rules 0 to 12: the questions name rules up to 12.
SYSTEM = "You are a helpful assistant. " + " ".join(
    f"Rule {i}: always be kind and precise about topic number {i}." for i in range(13)
)


def chat(
    client: openai.OpenAI, messages: list[dict[str, str]], max_tokens: int = 24, **body: Any
) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached prompt tokens) of one greedy turn (24 tokens: enough for
    same_answer's 60 characters; the cap tests, where only the KV's size matters, ask for fewer)."""
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0,  # type: ignore[arg-type]
                                       extra_body=body or None)  # fmt: skip
    details = r.usage.prompt_tokens_details
    return r.choices[0].message.content or "", r.usage.prompt_tokens, details.cached_tokens if details else 0


def same_answer(a: str, b: str) -> bool:
    """Greedy answers with and without a reused prefix, compared over their first 60 characters: KV
    that was wrong would change the answer from its first tokens, while llama.cpp's CPU kernels are
    not batch-invariant (a prefix computed inside a long prefill batch differs in the last bits), so
    on a busy box, where the thread count changes between requests too, a near tie late in an
    answer can go either way (seen: 88 equal characters, then `."` against `")`)."""
    return a[:60] == b[:60]


def conversation(question: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def test_a_second_turn_reuses_the_first_and_answers_the_same_as_without_reuse(start) -> None:  # type: ignore[no-untyped-def]
    client = client_for(start("--nctx", "2048", "--parallel", "1"))
    turn1 = conversation("What is rule 3?")
    answer1, prompt1, cached1 = chat(client, turn1)
    assert cached1 == 0
    turn2 = [*turn1, {"role": "assistant", "content": answer1}, {"role": "user", "content": "And rule 7?"}]
    answer2, prompt2, cached2 = chat(client, turn2)
    assert prompt1 < cached2 < prompt2, "the whole first turn, its answer included, was reused"
    fresh, _, none = chat(client, turn2, cache_prompt=False)
    assert none == 0 and same_answer(fresh, answer2), (fresh, answer2)
    # a new conversation behind the same system prompt reuses the system prompt
    _, prompt3, cached3 = chat(client, conversation("Tell me about rule 12."))
    assert prompt1 - 20 < cached3 < prompt3


def test_cache_salt_separates_callers(start) -> None:  # type: ignore[no-untyped-def]
    client = client_for(start("--nctx", "2048", "--parallel", "2"))
    messages = conversation("What is rule 5?")
    chat(client, messages, cache_salt="alice")
    _, prompt, cached = chat(client, messages, cache_salt="bob")
    assert cached == 0, "another salt never reuses a prefix"
    _, _, cached_again = chat(client, messages, cache_salt="alice")
    assert cached_again == prompt - 1


def test_a_cancelled_turn_leaves_nothing_behind(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "2048", "--parallel", "1")
    client = client_for(srv)
    messages = conversation("Write a very long story about rule 9.")
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=400, temperature=0, stream=True)  # type: ignore[arg-type]
    for i, _chunk in enumerate(stream):
        if i == 5:
            break
    stream.close()
    answer, _, cached = chat(client, messages)
    assert cached == 0, "neither the cancelled turn's prompt nor its tokens are reused"
    fresh = chat(client, messages, cache_prompt=False)[0]
    assert same_answer(answer, fresh), (answer, fresh)


def test_a_conversation_survives_its_slot_being_taken_by_another(start) -> None:  # type: ignore[no-untyped-def]
    client = client_for(start("--nctx", "2048", "--parallel", "1"))
    turn1 = conversation("What is rule 3?")
    answer1, prompt1, _ = chat(client, turn1)
    # Any other conversation takes the only slot; a short one costs the least prefill.
    chat(client, conversation("What is rule 3?", system="You are a pirate. " * 8))
    turn2 = [*turn1, {"role": "assistant", "content": answer1}, {"role": "user", "content": "And rule 7?"}]
    answer2, _, cached2 = chat(client, turn2)
    assert cached2 > prompt1, "restored from the RAM cache, the first answer included"
    fresh = chat(client, turn2, cache_prompt=False)[0]
    assert same_answer(answer2, fresh), (answer2, fresh)


# A conversation of about 100 tokens of KV, about 2.3 MB for SmolLM2: one fits in a 4 MiB RAM cache,
# two do not (as 7 MB in 8 MiB did, at a third of the prefill).
def churn(name: str) -> list[dict[str, str]]:
    return conversation("Hi.", system=f"{name}. {'Be brief. ' * 24}")


def test_the_ram_cache_stays_under_its_cap(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "1024", "--parallel", "1", "--cache-ram-mb", "4")
    client = client_for(srv)
    chat(client, churn("Conversation 0"), max_tokens=4)
    baseline = workers(srv)[0]["rss_bytes"]
    for n in range(1, 7):
        chat(client, churn(f"Conversation {n}"), max_tokens=4)
        row = workers(srv)[0]
        assert row["cache_bytes"] <= 4 << 20
    assert row["cache_evictions"] >= 4
    assert row["rss_bytes"] - baseline < (4 << 20) + (64 << 20)
    metrics = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
    assert "geniex:prompt_cache_evictions_total{" in metrics and "geniex:prompt_cache_bytes{" in metrics


def test_keep_cache_still_pins_a_conversation(start) -> None:  # type: ignore[no-untyped-def]
    client = client_for(start("--nctx", "1024", "--parallel", "1", "--cache-ram-mb", "4"))
    keep = {"GenieX-KeepCache": "true"}
    turn1 = conversation("Name three colours.", system=f"Pinned. {'Be brief. ' * 24}")
    r1 = client.chat.completions.create(model=MODEL, messages=turn1, max_tokens=20, temperature=0, extra_headers=keep)  # type: ignore[arg-type]
    for n in range(4):  # other conversations churn through the slot and the 4 MiB cache
        chat(client, churn(f"Churn {n}"), max_tokens=4)
    turn2 = [*turn1, {"role": "assistant", "content": r1.choices[0].message.content or ""},
             {"role": "user", "content": "And three animals?"}]  # fmt: skip
    _, _, cached = chat(client, turn2)
    assert cached > r1.usage.prompt_tokens, "the pinned conversation was kept through the churn"
