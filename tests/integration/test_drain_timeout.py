"""SIGTERM with requests that outlast --drain-timeout-s: each still ends with an answer (a 503 with
an error body, or an error event and [DONE] in a stream), never a cut connection or a bare 500.
Found by bench/soak.py: the drain under load ran out of time and uvicorn cut what was left."""

from __future__ import annotations

import json
import signal
import threading

import httpx

from tests.conftest import MODEL

LONG = [{"role": "user", "content": "Write a very long story about a dragon who learns to code."}]
NO_END = {"0": -100, "2": -100}  # SmolLM2's end tokens: generation runs to max_tokens


def test_requests_past_the_drain_timeout_end_with_503_or_an_error_event(start) -> None:  # type: ignore[no-untyped-def]
    srv = start("--nctx", "2048", "--parallel", "1", "--drain-timeout-s", "1")
    body = {"model": MODEL, "messages": LONG, "max_tokens": 1900, "logit_bias": NO_END, "temperature": 0}
    queued: dict[str, httpx.Response] = {}
    with httpx.stream("POST", f"{srv.base_url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        events = r.iter_lines()
        assert any('"content"' in line for line in events)  # the stream is under way
        # A second request waits in the queue behind it (one slot).
        t = threading.Thread(target=lambda: queued.update(r=httpx.post(f"{srv.base_url}/v1/chat/completions",
                                                                       json=body, timeout=120)))  # fmt: skip
        t.start()
        srv.proc.send_signal(signal.SIGTERM)
        rest = [line[6:] for line in events if line.startswith("data: ")]
    t.join(120)
    assert rest[-1] == "[DONE]", rest[-3:]
    error = json.loads(rest[-2])
    assert "shutting down" in error["error"], error
    r2 = queued["r"]
    assert r2.status_code == 503 and "shutting down" in r2.json()["error"], r2.text
    assert int(r2.headers["retry-after"]) > 0
    assert srv.proc.wait(60) == 0
