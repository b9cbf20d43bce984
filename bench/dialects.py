"""Streaming decode through the Anthropic dialect (`/v1/messages`), the OpenAI Responses dialect
(`/v1/responses`) and Ollama's (`/api/chat`, newline-delimited JSON) as ratios of
`/v1/chat/completions`, in the same run, on the same server and prompt, greedy.

    .venv/bin/python bench/dialects.py [--rounds 7] [--max-tokens 120] [--client raw|sdk]

A dialect is a translation at the edge, so its per-token cost is the gateway's: shaping each
worker Delta into a `content_block_delta` or `response.output_text.delta` event, or an Ollama
line, instead of a chat chunk (and, on `/v1/responses`, running the reasoning split, which that dialect always does).
Rounds alternate the routes (chat, messages, responses, chat, ...) so drift in machine load hits
all alike. Per route it reports the median decode tok/s at the client ((tokens - 1) / (last
content event - first content event)), the paired ratio to chat (median of route_i / chat_i over
adjacent rounds), and the gateway's CPU ms per token (psutil, the gateway process only: where the
translation runs).

`--client raw` (the default) reads every stream with the same minimal httpx line loop, so the
clients cost the same and only the server differs; `--client sdk` uses the official `openai`,
`anthropic` and `ollama` SDKs instead (their own parsing costs differ, and on a 2-core box that CPU is taken
from decoding). `--stream-interval-ms 0` (the default here) sends one event per token, the harshest
case for a per-token cost; pass the server's default 20 to measure what users see.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
import psutil

from bench.launcher import Server

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1"
SYSTEM = "You are a storyteller."
ASK = "Write a long story about a dragon who learns to code."  # bench.py's workload: SmolLM2 talks for all 120

Round = tuple[float, int]  # (decode tok/s at the client, completion tokens)


def _rate(first: float | None, last: float | None, tokens: int) -> float:
    return (tokens - 1) / (last - first) if first and last and last > first and tokens > 1 else 0.0


def raw_chat(http: httpx.Client, base: str, max_tokens: int) -> Round:
    body = {"model": MODEL, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    first = last = None
    tokens = 0
    with http.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                first = first or last
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return _rate(first, last, tokens), tokens


def raw_messages(http: httpx.Client, base: str, max_tokens: int) -> Round:
    body = {"model": MODEL, "system": SYSTEM, "messages": [{"role": "user", "content": ASK}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}  # fmt: skip
    first = last = None
    tokens = 0
    with http.stream("POST", f"{base}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if ev["type"] == "content_block_delta":
                last = time.perf_counter()
                first = first or last
            elif ev["type"] == "message_delta":
                tokens = ev["usage"]["output_tokens"]
    return _rate(first, last, tokens), tokens


def raw_responses(http: httpx.Client, base: str, max_tokens: int) -> Round:
    body = {"model": MODEL, "instructions": SYSTEM, "input": ASK, "max_output_tokens": max_tokens, "temperature": 0,
            "stream": True, "store": False}  # fmt: skip
    first = last = None
    tokens = 0
    with http.stream("POST", f"{base}/v1/responses", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if ev["type"] == "response.output_text.delta":
                last = time.perf_counter()
                first = first or last
            elif ev["type"] in ("response.completed", "response.incomplete"):
                tokens = ev["response"]["usage"]["output_tokens"]
    return _rate(first, last, tokens), tokens


def raw_ollama(http: httpx.Client, base: str, max_tokens: int) -> Round:
    # No `stream`: Ollama's default is to stream.
    body = {"model": MODEL, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}],
            "options": {"num_predict": max_tokens, "temperature": 0}}  # fmt: skip
    first = last = None
    tokens = 0
    with http.stream("POST", f"{base}/api/chat", json=body) as r:
        for line in r.iter_lines():
            if not line:
                continue
            part = json.loads(line)
            if part["message"]["content"]:
                last = time.perf_counter()
                first = first or last
            if part["done"]:
                tokens = part["eval_count"]
    return _rate(first, last, tokens), tokens


Runner = Callable[[int], Round]


def sdk_clients(base: str) -> tuple[Runner, Runner, Runner, Runner]:
    import anthropic
    import ollama
    import openai

    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
    an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=300)

    def chat(max_tokens: int) -> Round:
        first = last = None
        tokens = 0
        for ch in oa.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": SYSTEM},
                                                                    {"role": "user", "content": ASK}],
                                             max_tokens=max_tokens, temperature=0, stream=True,
                                             stream_options={"include_usage": True}):  # fmt: skip
            if ch.choices and ch.choices[0].delta.content:
                last = time.perf_counter()
                first = first or last
            if ch.usage:
                tokens = ch.usage.completion_tokens
        return _rate(first, last, tokens), tokens

    def messages(max_tokens: int) -> Round:
        first = last = None
        tokens = 0
        for ev in an.messages.create(model=MODEL, system=SYSTEM, messages=[{"role": "user", "content": ASK}],
                                     max_tokens=max_tokens, stream=True, extra_body={"temperature": 0}):  # fmt: skip
            if ev.type == "content_block_delta":
                last = time.perf_counter()
                first = first or last
            elif ev.type == "message_delta":
                tokens = ev.usage.output_tokens
        return _rate(first, last, tokens), tokens

    def responses(max_tokens: int) -> Round:
        first = last = None
        tokens = 0
        for ev in oa.responses.create(model=MODEL, instructions=SYSTEM, input=ASK, max_output_tokens=max_tokens,
                                      temperature=0, stream=True, store=False):  # fmt: skip
            if ev.type == "response.output_text.delta":
                last = time.perf_counter()
                first = first or last
            elif ev.type in ("response.completed", "response.incomplete") and ev.response.usage:
                tokens = ev.response.usage.output_tokens
        return _rate(first, last, tokens), tokens

    ol = ollama.Client(host=base, timeout=300)

    def ollama_chat(max_tokens: int) -> Round:
        first = last = None
        tokens = 0
        for part in ol.chat(model=MODEL, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}],
                            options={"num_predict": max_tokens, "temperature": 0}, stream=True):  # fmt: skip
            if part.message.content:
                last = time.perf_counter()
                first = first or last
            if part.done:
                tokens = part.eval_count or 0
        return _rate(first, last, tokens), tokens

    return chat, messages, responses, ollama_chat


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--max-tokens", type=int, default=120)
    p.add_argument("--client", choices=("raw", "sdk"), default="raw")
    p.add_argument("--stream-interval-ms", dest="stream_interval", type=int, default=0)
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "dialects.json")
    args = p.parse_args()
    srv = Server(Path(tempfile.mkdtemp(prefix="geniex-bench-")), "--stream-interval-ms", str(args.stream_interval))
    http = httpx.Client(timeout=300)
    try:
        srv.wait_ready()
        gateway = psutil.Process(srv.proc.pid)
        if args.client == "sdk":
            chat, messages, responses, ollama_chat = sdk_clients(srv.base_url)
        else:
            chat = lambda n: raw_chat(http, srv.base_url, n)  # noqa: E731
            messages = lambda n: raw_messages(http, srv.base_url, n)  # noqa: E731
            responses = lambda n: raw_responses(http, srv.base_url, n)  # noqa: E731
            ollama_chat = lambda n: raw_ollama(http, srv.base_url, n)  # noqa: E731
        routes: dict[str, Runner] = {"chat": chat, "messages": messages, "responses": responses, "ollama": ollama_chat}
        for run in routes.values():  # load the model, warm both paths
            run(8)
        rates: dict[str, list[float]] = {name: [] for name in routes}
        cpu_ms: dict[str, list[float]] = {name: [] for name in routes}
        for _ in range(args.rounds):
            for name, run in routes.items():
                c0 = sum(gateway.cpu_times()[:2])
                rate, tokens = run(args.max_tokens)
                rates[name].append(rate)
                cpu_ms[name].append((sum(gateway.cpu_times()[:2]) - c0) * 1000 / max(tokens, 1))
    finally:
        http.close()
        srv.stop()
    report: dict[str, Any] = {
        name: {"tok_s": round(statistics.median(rates[name]), 1),
               "gateway_cpu_ms_per_token": round(statistics.median(cpu_ms[name]), 3),
               "all_tok_s": [round(r, 1) for r in rates[name]]}
        for name in rates
    }  # fmt: skip
    others = ("messages", "responses", "ollama")
    for name in others:
        paired = [d / c for c, d in zip(rates["chat"], rates[name]) if c]
        report[f"paired_ratio_{name}"] = round(statistics.median(paired), 3)
    report["args"] = {k: str(v) for k, v in vars(args).items()}
    for name in rates:
        r = report[name]
        print(f"{name:9s} {r['tok_s']:7.1f} tok/s   gateway {r['gateway_cpu_ms_per_token']:.3f} ms CPU/token")
    paths = {"messages": "/v1/messages", "responses": "/v1/responses", "ollama": "/api/chat"}
    for name in others:
        print(f"{paths[name]} decode / /v1/chat/completions decode, paired median: {report[f'paired_ratio_{name}']:.3f} "
              f"(goal >= 0.98; {args.rounds} rounds, {args.max_tokens} tokens, client {args.client})")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
