"""API keys on the real server: the door, the labels, isolation of cached prompts, the exposure rule."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import MODEL
from tests.server_proc import ServerProcess, free_port

ALICE, BOB = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef"
LONG_SYSTEM = "You are helpful. " + "Be precise and kind. " * 60


def keyed(srv: ServerProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture
def keyfile(tmp_path: Path) -> Path:
    f = tmp_path / "keys"
    f.write_text(f"{ALICE} alice\n{BOB} bob\n")
    return f


def test_with_keys_every_route_but_the_probes_needs_one(start, keyfile: Path) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "1024", "--api-key-file", str(keyfile))
    url = f"{srv.base_url}/v1/models"
    for headers in ({}, {"authorization": "Bearer sk-wrong-0123456789"}, {"x-api-key": "nope"}):
        r = httpx.get(url, headers=headers, timeout=10)
        assert (
            r.status_code == 401
            and r.headers["www-authenticate"].startswith("Bearer")
            and "API key" in r.json()["error"]
        )
    assert httpx.get(url, headers={"authorization": f"Bearer {ALICE}"}, timeout=10).status_code == 200
    assert httpx.get(url, headers={"x-api-key": BOB}, timeout=10).status_code == 200
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{srv.base_url}{path}", timeout=10).status_code == 200, path
    with pytest.raises(openai.AuthenticationError):
        keyed(srv, "sk-wrong-0123456789").models.list()
    # the caller is named by its label in the ledger and the logs, never by its key
    keyed(srv, ALICE).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    rows = httpx.get(f"{srv.base_url}/v1/usage", headers={"x-api-key": ALICE}, timeout=10).json()["data"]
    assert [r["key"] for r in rows] == ["alice"]
    assert ALICE not in srv.log() and BOB not in srv.log()
    keyed_metrics = start("--nctx", "1024", "--api-key", ALICE, "--metrics-key")
    assert httpx.get(f"{keyed_metrics.base_url}/metrics", timeout=10).status_code == 401
    assert httpx.get(f"{keyed_metrics.base_url}/metrics", headers={"x-api-key": ALICE}, timeout=10).status_code == 200


def test_one_key_never_reuses_another_keys_cached_prompt(start, keyfile: Path) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "1024", "--parallel", "2", "--api-key-file", str(keyfile))
    messages = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": "Hello."}]

    def cached(key: str) -> int:
        r = keyed(srv, key).chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)  # type: ignore[arg-type]
        d = r.usage.prompt_tokens_details
        return d.cached_tokens if d else 0

    assert cached(ALICE) == 0
    assert cached(BOB) == 0, "bob does not see alice's prefix"
    assert cached(ALICE) > 0, "alice does"


def test_the_key_file_is_read_again_on_sighup(start, keyfile: Path) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "1024", "--api-key-file", str(keyfile))
    keyfile.write_text("sk-carol-0123456789abcdef carol\n")
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while httpx.get(f"{srv.base_url}/v1/models", headers={"x-api-key": ALICE}, timeout=10).status_code != 401:
        assert time.monotonic() < deadline, "the old key still works"
        time.sleep(0.1)
    assert (
        httpx.get(
            f"{srv.base_url}/v1/models", headers={"x-api-key": "sk-carol-0123456789abcdef"}, timeout=10
        ).status_code
        == 200
    )
    assert srv.proc.poll() is None


def test_binding_beyond_loopback_needs_a_key_or_an_explicit_opt_out(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENIEX_")}
    p = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--host", f"0.0.0.0:{free_port()}", "--data-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert p.returncode == 1 and "no API key is set" in p.stderr and "geniex serving" not in p.stderr
    port = free_port()
    open_srv = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--host", f"0.0.0.0:{port}", "--data-dir",
                                 str(tmp_path / "d"), "--insecure-no-auth"], stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        open_srv.send_signal(signal.SIGTERM)
        _, err = open_srv.communicate(timeout=30)
    assert "WITHOUT API KEYS" in err


def test_per_key_limits_answer_429_with_retry_after_and_show_in_metrics(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    carol = "sk-carol-0123456789abcdef"
    keys = tmp_path / "keys"
    keys.write_text(f"{ALICE} alice concurrent=1\n{BOB} bob rpm=2\n{carol} carol tpm=10\n")
    srv = start("--nctx", "1024", "--api-key-file", str(keys))
    url = f"{srv.base_url}/v1/models"

    def refused(r: httpx.Response, limit: str) -> None:
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60, r.text
        assert f"{limit} (" in r.json()["error"] and r.json()["request_id"]

    # concurrent: a second request while alice's stream runs (SmolLM2 tells this story for all 200
    # tokens, well past the quarter second a request over its concurrency waits)
    story = [{"role": "user", "content": "Write a long story about a dragon who learns to code."}]
    stream = keyed(srv, ALICE).chat.completions.create(model=MODEL, messages=story, max_tokens=200, stream=True)
    next(iter(stream))
    refused(httpx.get(url, headers={"x-api-key": ALICE}, timeout=10), "concurrent")
    assert sum(1 for _ in stream) > 0
    # The SDK stops reading at `[DONE]`, a moment before the server has closed the stream; the next
    # request, sent at once, waits for that instead of being refused.
    assert httpx.get(url, headers={"x-api-key": ALICE}, timeout=10).status_code == 200, "released when it ended"
    # rpm
    assert [httpx.get(url, headers={"x-api-key": BOB}, timeout=10).status_code for _ in range(2)] == [200, 200]
    refused(httpx.get(url, headers={"x-api-key": BOB}, timeout=10), "rpm")
    with pytest.raises(openai.RateLimitError):
        keyed(srv, BOB).models.list()
    # tpm: the first request is admitted under the limit and ends above it
    keyed(srv, carol).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi there."}], max_tokens=4
    )
    refused(httpx.get(url, headers={"x-api-key": carol}, timeout=10), "tpm")
    metrics = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
    assert 'geniex:key_requests_limited_total{key="bob",limit="rpm"} 2.0' in metrics
    assert 'geniex:key_requests_limited_total{key="alice",limit="concurrent"} 1.0' in metrics
    assert 'geniex:key_requests_inflight{key="alice"} 0.0' in metrics
