"""A chat request's thinking budget: how many tokens its thinking section (`<think>`...) may take
before the engine closes it and the answer follows (workers/engines/llama/think_budget.py).

Every dialect says it its own way and lands in the chat request's two fields: an exact count
(`thinking_budget_tokens`, llama-server's name; Anthropic's `thinking.budget_tokens`), which wins,
or an effort (OpenAI's `reasoning_effort` and Responses' `reasoning.effort`, Ollama's `think`),
read through `EFFORT_TOKENS`. Neither: the server's `--reasoning-budget` (applied with the other
server defaults, gateway/http/services.py).
"""

from __future__ import annotations

import msgspec

from protocol.chat import ChatRequest

UNLIMITED = -1

# What each effort means in thinking tokens (docs/api.md#reasoning-budgets). `none` and `minimal`
# think not at all, as OpenAI's `none` does; `max` leaves the model unbounded (max_tokens still is).
EFFORT_TOKENS: dict[str, int] = {
    "none": 0,
    "minimal": 0,
    "low": 1024,
    "medium": 4096,
    "high": 16384,
    "xhigh": 32768,
    "max": UNLIMITED,
}


def budget_of(req: ChatRequest) -> int:
    """The request's thinking budget in tokens: -1 unlimited, 0 none."""
    if req.thinking_budget_tokens is not None:
        return req.thinking_budget_tokens
    if req.reasoning_effort is not None:
        return EFFORT_TOKENS[req.reasoning_effort]
    return UNLIMITED


def with_server_budget(req: ChatRequest, default: int) -> ChatRequest:
    """`req` with the server's `--reasoning-budget` when it sets no budget of its own."""
    if default == UNLIMITED or req.thinking_budget_tokens is not None or req.reasoning_effort is not None:
        return req
    return msgspec.structs.replace(req, thinking_budget_tokens=default)
