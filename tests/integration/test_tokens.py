"""/tokenize and /detokenize in llama-server's shapes, for chat and embedding models."""

from __future__ import annotations

import httpx
import pytest
from llama_cpp import Llama

from gateway.models.store import bundled_models
from tests.conftest import MODEL
from tests.server_proc import ServerProcess

TEXT = "Hello, world! Ünïcödé and emoji 🦙 <|im_start|>user"


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:  # type: ignore[type-arg]
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=60)


@pytest.fixture(scope="module")
def reference() -> Llama:
    """llama.cpp's own tokenizer over the same GGUF, without the server."""
    gguf = next(e.path for e in bundled_models() if e.id == MODEL)
    return Llama(gguf, vocab_only=True, verbose=False)


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_tokenize_matches_llama_cpp_and_round_trips(server: ServerProcess, reference: Llama, prefix: str) -> None:
    for add_special in (False, True):
        r = post(server, f"{prefix}/tokenize", {"model": MODEL, "content": TEXT, "add_special": add_special})
        assert r.status_code == 200, r.text
        tokens = r.json()["tokens"]
        assert tokens == reference.tokenize(TEXT.encode(), add_bos=add_special, special=True)
        back = post(server, f"{prefix}/detokenize", {"model": MODEL, "tokens": tokens})
        assert back.status_code == 200 and back.json()["content"] == TEXT, back.text
    special = post(server, "/tokenize", {"content": "<|im_start|>", "parse_special": True}).json()["tokens"]
    plain = post(server, "/tokenize", {"content": "<|im_start|>", "parse_special": False}).json()["tokens"]
    assert len(special) == 1 and len(plain) > 1, "the special token is one id only when parsed as special"


def test_pieces_are_text_or_bytes(server: ServerProcess) -> None:
    r = post(server, "/tokenize", {"content": "Hi 🦙", "with_pieces": True})
    assert r.status_code == 200 and r.json()["model"] == MODEL  # the default model when none is named
    pieces = r.json()["tokens"]
    assert all(set(p) == {"id", "piece"} for p in pieces)
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert joined.decode() == "Hi 🦙"


def test_bad_input_is_a_400(server: ServerProcess) -> None:
    r = post(server, "/detokenize", {"tokens": [1, 10**6]})
    assert r.status_code == 400 and "not in the vocabulary" in r.json()["error"], r.text
    assert post(server, "/tokenize", {"content": 5}).status_code == 400
    assert post(server, "/tokenize", {"model": "no/such", "content": "x"}).status_code == 404
    r = post(server, "/tokenize", {"content": "x" * ((1 << 20) + 1)})
    assert r.status_code == 400 and "`content`" in r.json()["error"]


def test_hostile_values_are_answered_or_refused_never_a_500(server: ServerProcess) -> None:
    """NUL bytes, nesting where a string belongs, out-of-range ids, a NUL in a model name."""
    nul = post(server, "/tokenize", {"content": "a\x00b"})
    assert nul.status_code == 200 and post(server, "/detokenize", {"tokens": nul.json()["tokens"]}).status_code == 200
    for body in ({"content": [[["x"]]]}, {"content": "x", "model": "a\x00/b"}, {"content": "x", "add_special": "yes"}):
        r = post(server, "/tokenize", body)
        assert r.status_code in (400, 404) and isinstance(r.json()["error"], str), (body, r.text)
    for tokens in ([-1], [2**40], [[1]]):
        r = post(server, "/detokenize", {"tokens": tokens})
        assert r.status_code == 400, (tokens, r.text)
    for path in ("/v1/models/load", "/v1/models/unload"):
        for body in ({"model": "a\x00/b"}, {"model": MODEL, "nctx": 2**40}, {"model": MODEL, "compute": "x" * 10_000}):
            r = post(server, path, body)
            assert r.status_code in (400, 404), (path, body, r.text)


def test_a_model_without_a_tokenizer_is_refused_before_it_loads(server: ServerProcess) -> None:
    voice = "rhasspy/piper-en_US-joe:medium"  # a Piper voice: phonemes, no tokenizer (protocol/engines.py)

    def voice_workers() -> list[int]:
        rows = httpx.get(f"{server.base_url}/v1/workers", timeout=10).json()["data"]
        return sorted(w["pid"] for w in rows if w["model"] == voice)

    before = voice_workers()  # the shared server: another module may have loaded the voice
    for path, body in (
        ("/tokenize", {"model": voice, "content": "x"}),
        ("/detokenize", {"model": voice, "tokens": [1]}),
    ):
        r = post(server, path, body)
        assert r.status_code == 400 and "has no tokenizer" in r.json()["error"], r.text
    assert voice_workers() == before, "nothing was loaded for it"
