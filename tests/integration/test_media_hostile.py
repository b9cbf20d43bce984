"""Hostile values on the audio and vision routes: a NUL, nesting where a string belongs, numbers out
of range, a huge string. Each is a 400 (or 404 for a model that cannot exist), never a 500, and the
server answers the next request."""

from __future__ import annotations

import httpx
import pytest

from tests.server_proc import ServerProcess

NESTED: object = "x"
for _ in range(200):
    NESTED = [NESTED]

CASES = [
    ("/v1/audio/speech", {"model": "a\x00b/c", "input": "hi"}),
    ("/v1/audio/speech", {"model": "rhasspy/piper-en_US-joe:medium", "input": NESTED}),
    ("/v1/audio/speech", {"model": "rhasspy/piper-en_US-joe:medium", "input": "hi", "speed": 1e308}),
    ("/v1/audio/speech", {"model": "rhasspy/piper-en_US-joe:medium", "input": "x" * 100_000}),
    ("/v1/audio/diarize", {"model": "narcotic-sh/senko:fp32", "audio": NESTED}),
    ("/v1/audio/diarize", {"model": "narcotic-sh/senko:fp32", "audio": "data:audio/wav;base64,\x00\x00"}),
    ("/v1/cv", {"model": "RapidAI/RapidOCR:fp32", "image": "\x00" * 64}),
    ("/v1/cv", {"model": "RapidAI/RapidOCR:fp32", "image": NESTED}),
    ("/v1/images/generations", {"model": "x/y", "prompt": "a cat", "n": 2**70}),
    ("/v1/images/generations", {"model": "x/y", "prompt": NESTED}),
]


@pytest.mark.parametrize(("path", "body"), CASES)
def test_hostile_values_are_400s(server: ServerProcess, path: str, body: dict) -> None:  # type: ignore[type-arg]
    r = httpx.post(f"{server.base_url}{path}", json=body, timeout=60)
    assert r.status_code in (400, 404), r.text
    assert isinstance(r.json()["error"], str)
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
