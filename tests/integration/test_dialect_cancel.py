"""A client that leaves mid-answer on /v1/messages or /v1/responses: the generation is cancelled
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
}


@pytest.mark.parametrize("path", list(BODIES))
def test_a_client_leaving_mid_answer_cancels_it(server: ServerProcess, path: str) -> None:
    with httpx.stream("POST", f"{server.base_url}{path}", json=BODIES[path], timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        seen = [next(lines) for _ in range(12)]
        assert any(line.startswith("data:") for line in seen)
    deadline = time.monotonic() + 30  # a bound on waiting, not a speed claim
    while any(w["inflight"] for w in httpx.get(f"{server.base_url}/v1/workers", timeout=10).json()["data"]):
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.1)
    again = httpx.post(f"{server.base_url}{path}", json={**BODIES[path], "stream": False, "max_tokens": 2,
                                                           "max_output_tokens": 2}, timeout=60)  # fmt: skip
    assert again.status_code == 200, again.text
