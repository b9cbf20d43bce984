"""Speculative decoding through the real server, real SmolLM2 and the real SDK.

The property that matters: speculation changes speed, never output. Every emitted
token comes from one sampler call on the correct context, so greedy and seeded
outputs must equal those of the same request without speculation.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.models.store import bundled_models
from tests.conftest import MODEL
from tests.server_proc import ServerProcess

BUNDLED_PATH = bundled_models()[0].path
# Tokens per request: the repeat prompt's copy is under way by then, so ngram and draft speculation
# have drafts accepted (asserted below), and every equality is over as many tokens as ever matter for
# the stops and max_tokens cuts (9). It was 64, which doubled the module's decoding for no new check.
N = 32

# SmolLM2-135M copies this one faithfully, so self-speculation has something to find.
REPEAT = [{"role": "system", "content": "You copy text exactly."},
          {"role": "user", "content": "Copy this text: " + ", ".join(["apple", "banana", "cherry"] * 5)}]  # fmt: skip
NORMAL = [{"role": "user", "content": "Write a short poem about the sea."}]
PROMPTS = {"repeat": REPEAT, "normal": NORMAL}

SPECS: dict[str, dict[str, Any]] = {
    "ngram-simple": {"spec_type": "ngram-simple"},
    "ngram-map-k": {"spec_type": "ngram-map-k"},
    "draft-by-name": {"spec_type": "draft-simple", "spec_draft_model": MODEL},
    "draft-by-path": {"spec_type": "draft-simple", "spec_draft_model": BUNDLED_PATH},
}


def chat(client: openai.OpenAI, messages: list[dict[str, str]], spec: dict[str, Any] | None = None, **kw: Any):  # type: ignore[no-untyped-def]
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", N)
    return client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        extra_body={**(spec or {}), **kw.pop("extra_body", {})},
        **kw,
    )


@functools.cache
def _baseline(client: openai.OpenAI, prompt: str) -> tuple[str, str, int]:
    r = chat(client, PROMPTS[prompt])
    assert r.usage.completion_tokens_details is None  # no speculation, no details
    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens


def stream_text(client: openai.OpenAI, messages: list[dict[str, str]], spec: dict[str, Any], **kw: Any):  # type: ignore[no-untyped-def]
    chunks = list(chat(client, messages, spec, stream=True, stream_options={"include_usage": True}, **kw))
    *content, final, usage = chunks
    text = "".join(c.choices[0].delta.content or "" for c in content)
    return text, final.choices[0].finish_reason, usage.usage


# ---- greedy output is unchanged --------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("spec", SPECS)
def test_greedy_output_unchanged(client: openai.OpenAI, spec: str, prompt: str) -> None:
    text, finish, n = _baseline(client, prompt)
    r = chat(client, PROMPTS[prompt], SPECS[spec])
    assert r.choices[0].message.content == text
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == (finish, n)
    details = r.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens is not None
    if prompt == "repeat":
        assert details.accepted_prediction_tokens > 0, details
    if spec.startswith("draft"):  # the draft is the target itself: it is almost always right
        assert details.accepted_prediction_tokens > 0
        assert details.rejected_prediction_tokens <= details.accepted_prediction_tokens // 4, details


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("spec", SPECS)
def test_streamed_greedy_output_unchanged(client: openai.OpenAI, spec: str, prompt: str) -> None:
    text, finish, n = _baseline(client, prompt)
    got, got_finish, usage = stream_text(client, PROMPTS[prompt], SPECS[spec])
    assert (got, got_finish, usage.completion_tokens) == (text, finish, n)
    assert usage.completion_tokens_details is not None
    if prompt == "repeat":
        assert usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_usage_details_in_raw_json(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": REPEAT, "temperature": 0, "max_tokens": 16, "spec_type": "ngram-simple"}
    usage = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60).json()["usage"]
    details = usage["completion_tokens_details"]
    assert set(details) == {"accepted_prediction_tokens", "rejected_prediction_tokens"}
    body.pop("spec_type")
    usage = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60).json()["usage"]
    assert "completion_tokens_details" not in usage


# ---- seeded sampling, stops, limits ------------------------------------------


@pytest.mark.parametrize("spec", ["ngram-simple", "ngram-map-k", "draft-by-name"])
@pytest.mark.parametrize("sampling", [{}, {"extra_body": {"repetition_penalty": 1.1}}], ids=["default", "penalty"])
def test_seeded_sampling_unchanged(client: openai.OpenAI, spec: str, sampling: dict[str, Any]) -> None:
    # Penalties remember accepted tokens: a second accept per token would show here.
    # A seed whose sampled answer copies the list, so that there are drafts to verify: what a seed
    # samples depends on the build's arithmetic (with AVX-512, seed 1234 answered in prose).
    # So seeds are tried until one has had drafts accepted; every seed tried must match.
    accepted = 0
    for seed in (7, 1234, 1, 2, 3, 4, 5, 6):
        kw = {"temperature": 0.9, "seed": seed, **sampling}
        plain = chat(client, REPEAT, **kw)
        sped = chat(client, REPEAT, SPECS[spec], **kw)
        assert sped.choices[0].message.content == plain.choices[0].message.content, seed
        assert sped.usage.completion_tokens == plain.usage.completion_tokens, seed
        accepted += sped.usage.completion_tokens_details.accepted_prediction_tokens
        if accepted:
            break
    assert accepted > 0, "drafts were really verified"


@pytest.mark.parametrize("spec", ["ngram-simple", "draft-by-name"])
def test_stop_strings_and_max_tokens_cut_inside_a_draft(client: openai.OpenAI, spec: str) -> None:
    full, _, _ = _baseline(client, "repeat")
    words = full.split()
    stop = words[7]
    r = chat(client, REPEAT, SPECS[spec], stop=stop)
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    for n in (1, 2, 5, 9):
        r = chat(client, REPEAT, SPECS[spec], max_tokens=n)
        assert r.usage.completion_tokens == n and r.choices[0].finish_reason == "length"
        assert full.startswith(r.choices[0].message.content)


def test_large_n_max_and_n_min(client: openai.OpenAI) -> None:
    text, _, _ = _baseline(client, "repeat")
    for extra in ({"spec_n_max": 16}, {"spec_n_max": 8, "spec_n_min": 4}, {"spec_n_max": 6, "spec_p_min": 0.9}):
        for kind in ("ngram-map-k", "draft-simple"):
            spec = {"spec_type": kind, "spec_draft_model": MODEL, **extra}
            assert chat(client, REPEAT, spec).choices[0].message.content == text, spec


def test_keep_cache_turns_with_speculation(client: openai.OpenAI) -> None:
    keep = {"GenieX-KeepCache": "true"}
    spec = SPECS["ngram-map-k"]
    r1 = chat(client, REPEAT, spec, max_tokens=24, extra_headers=keep)
    turn2 = [*REPEAT, {"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "Again, please."}]  # fmt: skip
    r2 = chat(client, turn2, spec, max_tokens=24, extra_headers=keep)
    assert r2.usage.prompt_tokens_details and r2.usage.prompt_tokens_details.cached_tokens > 0
    assert r2.choices[0].message.content == chat(client, turn2, max_tokens=24).choices[0].message.content


# ---- under batching ------------------------------------------------------------

BATCH_PROMPTS = [
    REPEAT,
    NORMAL,
    [{"role": "user", "content": "List the numbers from 1 to 30, separated by commas."}],
    [{"role": "user", "content": "Copy this: red blue green red blue green red blue green red blue green"}],
]


def _concurrent(client: openai.OpenAI, specs: list[dict[str, Any]]) -> list[str]:
    with ThreadPoolExecutor(len(BATCH_PROMPTS)) as pool:
        futures = [pool.submit(chat, client, p, s) for p, s in zip(BATCH_PROMPTS, specs)]
        return [f.result().choices[0].message.content for f in futures]


@functools.cache
def _solo(client: openai.OpenAI) -> list[str]:
    """Each batch prompt alone, without speculation: the same for both concurrent tests, so computed once.
    The first two are REPEAT and NORMAL, whose answers _baseline already has."""
    assert BATCH_PROMPTS[:2] == [REPEAT, NORMAL]
    known = [_baseline(client, "repeat")[0], _baseline(client, "normal")[0]]
    return known + [chat(client, p).choices[0].message.content for p in BATCH_PROMPTS[2:]]


def test_concurrent_ngram_requests_equal_solo(client: openai.OpenAI) -> None:
    solo = _solo(client)
    specs = [SPECS["ngram-simple"], SPECS["ngram-map-k"]] * 2
    assert _concurrent(client, specs) == solo
    # and mixed with requests that do not speculate
    assert _concurrent(client, [specs[0], {}, specs[1], {}]) == solo


def test_concurrent_draft_model_requests_equal_solo(client: openai.OpenAI) -> None:
    solo = _solo(client)
    specs = [SPECS["draft-by-name"], SPECS["draft-by-path"], SPECS["ngram-simple"], SPECS["draft-by-name"]]
    assert _concurrent(client, specs) == solo


# ---- refusals ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"spec_type": "draft-mtp"}, "draft-mtp"),
        ({"spec_type": "draft-eagle3"}, "draft-eagle3"),
        ({"spec_type": "ngram-mod"}, "not supported"),
        ({"spec_type": "warp-drive"}, "unknown value"),
        ({"spec_type": "draft-simple"}, "spec_draft_model"),
        ({"spec_type": "draft-simple", "spec_draft_model": "nobody/nothing:Q4_0"}, "geniex pull"),
        ({"spec_type": "draft-simple", "spec_draft_model": "/etc/passwd"}, "outside"),
        ({"spec_type": "draft-simple", "spec_draft_model": "models/x.gguf"}, "geniex pull"),
        ({"spec_type": "ngram-simple", "spec_n_max": 0}, "spec_n_max"),
        ({"spec_type": "ngram-simple", "spec_n_min": -1}, "spec_n_min"),
        ({"spec_type": "ngram-simple", "spec_p_min": 1.5}, "spec_p_min"),
        ({"spec_type": "ngram-simple", "spec_n_max": 2, "spec_n_min": 3}, "spec_n_min"),
    ],
)
def test_bad_speculation_is_400(server: ServerProcess, extra: dict[str, Any], needle: str) -> None:
    for stream in (False, True):
        body = {"model": MODEL, "messages": NORMAL, "max_tokens": 4, "stream": stream, **extra}
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert needle in r.json()["error"], r.text


def test_symlink_outside_the_store_is_400(server: ServerProcess, tmp_path: Path) -> None:
    link = tmp_path / "smol.gguf"
    link.symlink_to(BUNDLED_PATH)  # a real model, but reached through a path outside the allowed folders
    body = {
        "model": MODEL,
        "messages": NORMAL,
        "max_tokens": 4,
        "spec_type": "draft-simple",
        "spec_draft_model": str(link),
    }
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "outside" in r.json()["error"], r.text
