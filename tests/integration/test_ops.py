"""`/metrics`, `/v1/usage` and `geniex usage` against the real server, worker and SmolLM2."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from gateway.ops.ledger import key_label
from tests.conftest import MODEL
from tests.server_proc import ServerProcess
from tests.unit.test_metrics import NAMES

KEY = "sk-geniex-ops-test-0123456789abcd"
HAIKU = [{"role": "user", "content": "Write a short poem about the sea."}]
METRIC_NAMES = NAMES  # the one list of names dashboards rely on


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of `name` whose labels include `labels`."""
    for line in text.splitlines():
        m = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    raise AssertionError(f"no sample {name}{labels}")


def usage_rows(srv: ServerProcess, **params: str) -> list[dict]:  # type: ignore[type-arg]
    r = httpx.get(f"{srv.base_url}/v1/usage", params=params, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    return body["data"]


def by_key_user(rows: list[dict]) -> dict[tuple[str, str], tuple[int, int, int]]:  # type: ignore[type-arg]
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    for r in rows:
        assert r["model"] == MODEL and r["total_tokens"] == r["prompt_tokens"] + r["completion_tokens"]
        prev = out.get((r["key"], r["user"]), (0, 0, 0))
        out[(r["key"], r["user"])] = (
            prev[0] + r["requests"],
            prev[1] + r["prompt_tokens"],
            prev[2] + r["completion_tokens"],
        )
    return out


def test_metrics_usage_ledger_and_restart(data_dir: Path) -> None:
    srv = ServerProcess(data_dir, "--nctx", "1024")
    try:
        srv.wait_ready()
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
        got: list[tuple[str, int, int]] = []  # (user, prompt, completion) as the SDK reported them
        for user, n in (("alice", 5), ("", 7)):
            kw = {"user": user} if user else {}
            r = client.chat.completions.create(model=MODEL, messages=HAIKU, max_tokens=n, temperature=0, **kw)
            got.append((user, r.usage.prompt_tokens, r.usage.completion_tokens))
        chunks = list(client.chat.completions.create(model=MODEL, messages=HAIKU, max_tokens=6, stream=True, user="alice",
                                                     stream_options={"include_usage": True}))  # fmt: skip
        u = chunks[-1].usage
        got.append(("alice", u.prompt_tokens, u.completion_tokens))
        # No Authorization header at all: the anonymous key.
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", timeout=120,
                       json={"model": MODEL, "messages": HAIKU, "max_tokens": 3})  # fmt: skip
        anon = r.json()["usage"]
        # A refused request (prompt longer than its context) is an error: no usage, but counted.
        bad = httpx.post(f"{srv.base_url}/v1/chat/completions", timeout=120,
                         json={"model": MODEL, "messages": [{"role": "user", "content": "word " * 400}], "nctx": 256})  # fmt: skip
        assert bad.status_code == 400

        prompt_sum = sum(p for _, p, _ in got) + anon["prompt_tokens"]
        completion_sum = sum(c for _, _, c in got) + anon["completion_tokens"]
        assert completion_sum == 5 + 7 + 6 + 3

        # ---- /metrics
        r = httpx.get(f"{srv.base_url}/metrics", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        text = r.text
        for name in METRIC_NAMES:
            sample(text, name, model=MODEL)  # present, with the model label
        assert "\nprocess_resident_memory_bytes " in text
        for name in ("llamacpp:prompt_tokens_total", "vllm:prompt_tokens_total"):
            assert sample(text, name, model=MODEL) == prompt_sum
        for name in ("llamacpp:tokens_predicted_total", "vllm:generation_tokens_total"):
            assert sample(text, name, model=MODEL) == completion_sum
        assert sample(text, "geniex:requests_total", model=MODEL, outcome="ok") == 4
        assert sample(text, "geniex:requests_total", model=MODEL, outcome="error") == 1
        assert sample(text, "vllm:e2e_request_latency_seconds_count", model=MODEL) == 4
        assert sample(text, "vllm:time_to_first_token_seconds_count", model=MODEL) == 4
        assert sample(text, "geniex:worker_resident_memory_bytes", model=MODEL) > 10_000_000
        assert sample(text, "vllm:num_requests_running", model=MODEL) == 0
        assert sample(text, "geniex:worker_starts_total", model=MODEL) == 2  # nctx 1024 and 256

        # ---- /v1/usage
        label = key_label(f"Bearer {KEY}")
        assert label != KEY and KEY not in json.dumps(usage_rows(srv))
        expected = {
            (label, "alice"): (2, got[0][1] + got[2][1], got[0][2] + got[2][2]),
            (label, ""): (1, got[1][1], got[1][2]),
            ("anonymous", ""): (1, anon["prompt_tokens"], anon["completion_tokens"]),
        }
        assert by_key_user(usage_rows(srv)) == expected
        assert usage_rows(srv, model="nobody/nothing:Q4_0") == []
        assert usage_rows(srv, since="2999-01-01") == []
        day = usage_rows(srv)[0]["day"]
        assert by_key_user(usage_rows(srv, since=day, model=MODEL)) == expected
        assert httpx.get(f"{srv.base_url}/v1/usage", params={"since": "yesterday"}).status_code == 400
    finally:
        rc = srv.stop()  # SIGTERM: a graceful stop; uvicorn re-raises the signal once it has shut down
    assert rc in (0, -signal.SIGTERM), srv.log_path.read_text(errors="replace")

    # ---- a restart on the same data dir keeps every answered request
    srv = ServerProcess(data_dir, "--nctx", "1024")
    try:
        srv.wait_ready()
        assert by_key_user(usage_rows(srv)) == expected
        # `geniex usage --json` reads the same file, while the server runs.
        out = subprocess.run([sys.executable, "-m", "gateway.cli", "usage", "--json", "--data-dir", str(data_dir)],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        assert json.loads(out.stdout) == usage_rows(srv)
        table = subprocess.run([sys.executable, "-m", "gateway.cli", "usage", "--data-dir", str(data_dir)],
                               capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
        assert table.splitlines()[0].split() == [
            "DAY",
            "MODEL",
            "KEY",
            "USER",
            "REQUESTS",
            "PROMPT",
            "COMPLETION",
            "TOTAL",
        ]
        assert label in table and "anonymous" in table and "alice" in table
    finally:
        srv.stop()


def test_an_idle_connection_outlives_the_clients_own_idle_bound(server: ServerProcess) -> None:
    """httpx and the OpenAI SDK reuse a connection idle for up to 5 s; a server that closed it at 5 s
    (uvicorn's default) raced them, and a request sent as it closed was lost ("Server disconnected
    without sending a response"). The server keeps it longer, so the client's own bound ends it."""
    url = httpx.URL(server.base_url)
    with socket.create_connection((url.host, url.port), timeout=10) as sock:
        request = f"GET /health HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n\r\n".encode()
        for idle_s in (0.0, 5.5):  # then past the client's idle bound
            time.sleep(idle_s)
            sock.sendall(request)
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer  # b"": the server had closed it
