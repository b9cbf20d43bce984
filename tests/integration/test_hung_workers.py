"""Hung workers and deadlines on the real server and the real engine (SmolLM2): SIGSTOP to a chat
worker mid-stream, and with a request waiting in its queue, ends both clients' requests with an
error naming the hang within the bound, the next request is served by a new worker, and nothing
else failed; a request past `--request-timeout-s` (or its key's `timeout=`) is a 504 before the
first byte and an error event then [DONE] in a stream, counted as cancelled."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import MODEL
from tests.integration.test_ops import sample
from tests.server_proc import ServerProcess

SILENCE_S = 3.0
STORY = [{"role": "user", "content": "Write a very long story about a dragon who learns to code."}]


def workers(srv: ServerProcess) -> list[dict[str, Any]]:
    return httpx.get(f"{srv.base_url}/v1/workers", timeout=10).json()["data"]


def test_a_stopped_worker_fails_its_streams_and_its_queue_and_is_replaced(
    start: Callable[..., ServerProcess],
) -> None:
    srv = start("--hang-silence-s", str(SILENCE_S), "--parallel", "1", "--max-queue", "4", "--nctx", "1024")
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    assert client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=2).choices  # loaded
    [w] = workers(srv)
    assert w["heard_s_ago"] is not None and w["heard_s_ago"] < 2.5 and w["hung"] is None  # it beats
    outcomes: dict[str, str] = {}

    def queued() -> None:  # parallel 1: this one waits behind the stream in the worker's queue
        try:
            client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=400)
            outcomes["queued"] = "answered"
        except openai.APIError as exc:
            outcomes["queued"] = str(exc.body)

    stream = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=400, stream=True)
    got = iter(stream)
    assert next(got).choices is not None
    waiter = threading.Thread(target=queued)
    waiter.start()
    time.sleep(0.5)
    os.kill(w["pid"], signal.SIGSTOP)
    stopped = time.monotonic()
    with pytest.raises(openai.APIError) as e:
        for _ in got:
            pass
    took = time.monotonic() - stopped
    waiter.join(timeout=30)
    said = str(e.value.body)  # the error event's text, as the SDK keeps it
    assert "made no progress" in said and "sent nothing" in said, said
    assert took < SILENCE_S + 4.0, took  # the bound, the once-a-second check, a beat's interval, a margin
    assert "made no progress" in outcomes.get("queued", ""), outcomes
    # the next request is served by a new worker; the old one is gone, and /ready says why it restarted
    again = client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=4)
    assert again.choices[0].message.content
    [w2] = workers(srv)
    assert w2["pid"] != w["pid"] and w2["state"] in ("idle", "busy")
    assert not alive(w["pid"])
    metrics = httpx.get(f"{srv.base_url}/metrics").text
    assert sample(metrics, "geniex:worker_hangs_total", model=MODEL) == 1
    assert "Traceback" not in srv.log()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_request_past_its_deadline_is_a_504_or_an_error_event_and_counted_cancelled(
    start: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("sk-patient-0001 patient\nsk-hasty-00002 hasty timeout=1\n")
    srv = start("--api-key-file", str(keys), "--request-timeout-s", "30", "--nctx", "1024")
    patient = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="sk-patient-0001", max_retries=0, timeout=120)
    hasty = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="sk-hasty-00002", max_retries=0, timeout=120)
    assert patient.chat.completions.create(model=MODEL, messages=STORY, max_tokens=2).choices  # loaded, in time
    with pytest.raises(openai.APIStatusError) as e:
        hasty.chat.completions.create(model=MODEL, messages=STORY, max_tokens=2000)
    assert e.value.status_code == 504 and "limit of 1 s" in str(e.value.body)
    chunks = []
    with pytest.raises(openai.APIError) as streamed:
        for chunk in hasty.chat.completions.create(model=MODEL, messages=STORY, max_tokens=2000, stream=True):
            chunks.append(chunk)
    assert chunks and "limit of 1 s" in str(streamed.value.body)
    # the slot is free again: the patient key's request is served at once, in full
    r = patient.chat.completions.create(model=MODEL, messages=STORY, max_tokens=8)
    assert r.choices[0].finish_reason == "length"
    metrics = httpx.get(f"{srv.base_url}/metrics", headers={"authorization": "Bearer sk-patient-0001"}).text
    assert sample(metrics, "geniex:requests_total", model=MODEL, outcome="cancelled") == 2
    assert sample(metrics, "geniex:requests_total", model=MODEL, outcome="ok") == 2
    [w] = workers_with_key(srv)
    assert w["inflight"] == 0


def workers_with_key(srv: ServerProcess) -> list[dict[str, Any]]:
    r = httpx.get(f"{srv.base_url}/v1/workers", headers={"authorization": "Bearer sk-patient-0001"}, timeout=10)
    return r.json()["data"]
