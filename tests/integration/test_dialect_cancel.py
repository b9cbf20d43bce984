"""A client that leaves mid-answer on /v1/messages, /v1/responses or Ollama's /api/chat: the generation is cancelled
on the worker (nothing stays in flight), and the server goes on answering."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess

STORY = "Tell me a very long story about a dragon."
BODIES = {
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 2000,
        "stream": True,
        "messages": [{"role": "user", "content": STORY}],
    },
    "/v1/responses": {"model": MODEL, "max_output_tokens": 2000, "stream": True, "input": STORY},
    # Ollama streams by default
    "/api/chat": {"model": MODEL, "options": {"num_predict": 2000}, "messages": [{"role": "user", "content": STORY}]},
}
# The same request, answered whole and short: the server goes on answering.
SHORT = {"/v1/messages": {"stream": False, "max_tokens": 2}, "/v1/responses": {"stream": False, "max_output_tokens": 2},
         "/api/chat": {"stream": False, "options": {"num_predict": 2}}}  # fmt: skip


@pytest.mark.parametrize("path", list(BODIES))
def test_a_client_leaving_mid_answer_cancels_it(server: ServerProcess, path: str) -> None:
    with httpx.stream("POST", f"{server.base_url}{path}", json=BODIES[path], timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        seen = [next(lines) for _ in range(12)]
        assert any(line.startswith(("data:", "{")) for line in seen)  # SSE, or Ollama's JSON lines
    deadline = time.monotonic() + 30  # a bound on waiting, not a speed claim
    while any(w["inflight"] for w in httpx.get(f"{server.base_url}/v1/workers", timeout=10).json()["data"]):
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.1)
    again = httpx.post(f"{server.base_url}{path}", json={**BODIES[path], **SHORT[path]}, timeout=60)
    assert again.status_code == 200, again.text
