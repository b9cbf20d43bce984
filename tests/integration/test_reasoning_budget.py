"""`--reasoning-budget` on a server of its own: the budget of every request that sets none, on chat
completions and Ollama's `/api/chat` (whose `think` has no count of its own); a request's own budget
wins. The model thinks from its first token (tests/thinking_model.py). The per-request fields of
every dialect are tested on the shared server (test_chat_features.py, test_messages.py,
test_responses.py); the table and the bounds in tests/unit/test_reasoning_budget_table.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.server_proc import ServerProcess, serving
from tests.thinking_model import pull_thinking_model

STORY = "Write a long story about a dragon who learns to bake bread."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("budget")
    pull_thinking_model(base / "data", base)
    with serving(base / "data", "--nctx", "1024", "--reasoning-budget", "8") as srv:
        yield srv


@pytest.fixture(scope="module")
def model(server: ServerProcess) -> str:
    return "test/SmolLM2-think:Q4_1"


def chat(server: ServerProcess, model: str, **extra: object) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": STORY}], max_tokens=30,
                                          temperature=0, extra_body={"reasoning_format": "deepseek", **extra})  # fmt: skip


def test_the_flag_is_the_budget_of_a_request_without_one(server: ServerProcess, model: str) -> None:
    r = chat(server, model)
    assert r.usage.completion_tokens_details.reasoning_tokens == 8  # type: ignore[union-attr]
    assert r.choices[0].message.content and r.choices[0].message.reasoning_content  # type: ignore[attr-defined]
    # The request's own budget wins, an unlimited one too.
    assert chat(server, model, thinking_budget_tokens=3).usage.completion_tokens_details.reasoning_tokens == 3  # type: ignore[union-attr]
    unlimited = chat(server, model, thinking_budget_tokens=-1)
    assert unlimited.usage.completion_tokens_details.reasoning_tokens == 30 and not unlimited.choices[0].message.content  # type: ignore[union-attr]


def test_ollama_think_reads_the_flag_and_false_thinks_not_at_all(server: ServerProcess, model: str) -> None:
    reference = chat(server, model).choices[0].message

    def ask(think: object) -> dict[str, Any]:
        body = {"model": model, "messages": [{"role": "user", "content": STORY}], "stream": False, "think": think,
                "options": {"temperature": 0, "num_predict": 30}}  # fmt: skip
        r = httpx.post(f"{server.base_url}/api/chat", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["message"]

    on = ask(True)
    assert (on["thinking"], on["content"]) == (reference.reasoning_content, reference.content)  # type: ignore[attr-defined]
    off = ask(False)
    assert not off.get("thinking") and off["content"]
    low = ask("low")  # 1024 tokens: beyond these 30, the thinking runs on
    assert low["thinking"].startswith(on["thinking"]) and len(low["thinking"]) > len(on["thinking"])
    r = httpx.post(f"{server.base_url}/api/chat", json={"model": model, "messages": [], "think": "extreme"}, timeout=30)
    assert r.status_code == 400 and "think" in r.json()["error"]
