"""Metrics: names exported, values that move with the recorder, scrape-time gauges from a pool,
and the relay's accounting (settled once, whichever exit a request takes)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from types import SimpleNamespace

import psutil
import pytest
from prometheus_client import generate_latest

from gateway.chat.convert import Shape
from gateway.chat.shape import ChoiceShaper
from gateway.errors import ClientGone, WorkerDied
from gateway.http.relay import Completion, collect, merged, sse
from gateway.ops import metrics as metrics_mod
from gateway.ops.accounting import Accounting, outcome_of
from gateway.ops.metrics import Metrics
from protocol.wire import Delta, Done

M = "org/model:Q4_0"
NAMES = [
    "llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "llamacpp:requests_processing", "llamacpp:requests_deferred",
    "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "geniex:worker_starts_total", "geniex:worker_crashes_total", "geniex:worker_hangs_total",
    "geniex:worker_evictions_total",
    "geniex:worker_resident_memory_bytes", "geniex:requests_total",
    "geniex:prompt_cache_bytes", "geniex:prompt_cache_evictions_total",
]  # fmt: skip


def val(m: Metrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


def fake_worker(inflight: int, parallel: int | None, pid: int | None = None, status: str = "busy") -> SimpleNamespace:
    return SimpleNamespace(
        key=SimpleNamespace(model=M, slug=f"model.cpu.{inflight}"),
        ready_info=SimpleNamespace(parallel=parallel) if parallel is not None else None,
        inflight=inflight, pid=pid, status=status,
        rss=lambda: psutil.Process(pid).memory_info().rss if pid else None,
        cache_bytes=1000, cache_evictions=2,
    )  # fmt: skip


def test_every_name_is_exported_with_the_model_label() -> None:
    m = Metrics()
    m.watch(SimpleNamespace(workers={1: fake_worker(1, 4, os.getpid())}))
    t = m.timer(M)
    t.first_token()
    t.finish(10, 3, "ok")
    text = generate_latest(m.registry).decode()
    for name in NAMES:
        assert f"{name}{{" in text and f'model="{M}"' in text.split(name + "{", 1)[1].split("\n", 1)[0], name
    assert "\nprocess_resident_memory_bytes " in text


def test_recorder_moves_counters_and_histograms() -> None:
    m = Metrics(process=False)
    t = m.timer(M)
    t.first_token()
    t.finish(20, 5, "ok")
    t.finish(20, 5, "ok")  # a second exit does not count twice
    assert val(m, "llamacpp:prompt_tokens_total", model=M) == 20 == val(m, "vllm:prompt_tokens_total", model=M)
    assert val(m, "llamacpp:tokens_predicted_total", model=M) == 5 == val(m, "vllm:generation_tokens_total", model=M)
    assert val(m, "geniex:requests_total", model=M, outcome="ok") == 1
    for h in (
        "vllm:time_to_first_token_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        assert val(m, f"{h}_count", model=M) == 1, h
    # An error before any token: counted, but no latency and no tokens; a cancelled one keeps its tokens.
    m.timer(M).finish(0, 0, "error")
    c = m.timer(M)
    c.first_token()
    c.finish(0, 2, "cancelled")
    assert val(m, "geniex:requests_total", model=M, outcome="error") == 1
    assert val(m, "geniex:requests_total", model=M, outcome="cancelled") == 1
    assert val(m, "vllm:generation_tokens_total", model=M) == 7
    assert val(m, "vllm:time_to_first_token_seconds_count", model=M) == 2
    assert val(m, "vllm:e2e_request_latency_seconds_count", model=M) == 1  # only successful requests


def test_reused_prompt_tokens_are_counted() -> None:
    m = Metrics(process=False)
    m.timer(M).finish(30, 2, "ok", cached=25)
    m.timer(M).finish(30, 2, "ok")
    assert val(m, "geniex:prompt_cache_hits_total", model=M) == 1
    assert val(m, "geniex:prompt_cache_reused_tokens_total", model=M) == 25


def test_time_per_output_token_is_the_mean_gap_after_the_first() -> None:
    m = Metrics(process=False)
    t = m.timer(M, started=0.0)
    t.first = 1.0  # as if the first token came at t=1s
    real = metrics_mod.time.perf_counter
    metrics_mod.time.perf_counter = lambda: 3.0  # type: ignore[assignment]
    try:
        t.finish(1, 5, "ok")  # 4 gaps in 2 s
    finally:
        metrics_mod.time.perf_counter = real  # type: ignore[assignment]
    assert val(m, "vllm:time_per_output_token_seconds_sum", model=M) == pytest.approx(0.5)
    assert val(m, "vllm:time_to_first_token_seconds_sum", model=M) == pytest.approx(1.0)
    assert val(m, "vllm:e2e_request_latency_seconds_sum", model=M) == pytest.approx(3.0)


def test_scrape_time_gauges_from_the_pool() -> None:
    m = Metrics(process=False)
    pool = SimpleNamespace(
        workers={1: fake_worker(6, 4, os.getpid()), 2: fake_worker(1, 2), 3: fake_worker(0, None, status="starting")}
    )
    m.watch(pool)
    assert val(m, "llamacpp:requests_processing", model=M) == 5 == val(m, "vllm:num_requests_running", model=M)
    assert val(m, "llamacpp:requests_deferred", model=M) == 2 == val(m, "vllm:num_requests_waiting", model=M)
    rss = val(m, "geniex:worker_resident_memory_bytes", model=M, worker="model.cpu.6", pid=str(os.getpid()))
    assert rss > 1_000_000
    assert (
        val(m, "geniex:workers", model=M, state="busy") == 2
        and val(m, "geniex:workers", model=M, state="starting") == 1
    )
    pool.workers.clear()
    assert val(m, "vllm:num_requests_running", model=M) == 0
    m.watch(None)
    assert "vllm:num_requests_running" in generate_latest(m.registry).decode()  # described, just empty


def test_worker_lifecycle_hooks() -> None:
    m = Metrics(process=False)
    m.worker_started(M)
    m.worker_started(M)
    m.worker_crashed(M)
    m.worker_evicted(M)
    after = {n: val(m, f"geniex:worker_{n}_total", model=M) for n in ("starts", "crashes", "evictions")}
    assert after == {"starts": 2, "crashes": 1, "evictions": 1}


# ---- the relay's accounting --------------------------------------------------


async def feed(*msgs: Delta | Done | Exception) -> AsyncIterator[tuple[int, Delta | Done]]:
    for msg in msgs:
        if isinstance(msg, Exception):
            raise msg
        yield 0, msg


def shapers() -> list[ChoiceShaper]:
    return [ChoiceShaper(0, Shape())]


def accounted() -> tuple[Completion, Metrics, list[tuple[int, int]]]:
    m = Metrics(process=False)
    billed: list[tuple[int, int]] = []
    return Completion(M, Accounting(m.timer(M), lambda p, c, _j: billed.append((p, c)))), m, billed


async def test_collect_settles_ok_once() -> None:
    c, m, billed = accounted()
    out = await collect(c, shapers(), feed(Delta(1, "Hi", 1), Delta(1, " there", 3), Done(1, "length", 9, 3)))
    assert out.choices[0].message.content == "Hi there" and out.usage.completion_tokens == 3
    assert billed == [(9, 3)]
    assert val(m, "geniex:requests_total", model=M, outcome="ok") == 1
    assert val(m, "vllm:time_to_first_token_seconds_count", model=M) == 1


async def test_sse_counts_before_the_final_bytes_and_on_errors_and_disconnects() -> None:
    c, m, billed = accounted()
    gen = sse(c, shapers(), (0, Delta(1, "a", 1)), feed(Delta(1, "b", 2), Done(1, "stop", 4, 2)), include_usage=False)
    chunks = [chunk async for chunk in gen]
    assert chunks[-1] == b"[DONE]" and billed == [(4, 2)]

    # the worker dies mid-stream: an error, but the tokens the client got are billed
    c, m, billed = accounted()
    chunks = [
        chunk
        async for chunk in sse(c, shapers(), (0, Delta(1, "a", 1)), feed(Delta(1, "b", 2), WorkerDied("gone")), False)
    ]
    assert b"gone" in chunks[-2] and billed == [(0, 2)]
    assert val(m, "geniex:requests_total", model=M, outcome="error") == 1

    # the client goes away after two chunks: cancelled, its generated tokens still counted
    c, m, billed = accounted()
    gen = sse(
        c, shapers(), (0, Delta(1, "a", 1)), feed(Delta(1, "b", 2), Delta(1, "c", 3), Done(1, "stop", 4, 3)), False
    )
    await anext(gen)
    await anext(gen)
    await gen.aclose()
    assert billed == [(0, 1)]
    assert val(m, "geniex:requests_total", model=M, outcome="cancelled") == 1
    assert val(m, "vllm:generation_tokens_total", model=M) == 1


async def test_guard_counts_failures_before_the_stream_and_cancellation() -> None:
    c, m, billed = accounted()
    with pytest.raises(WorkerDied):
        await c.guard(anext(feed(WorkerDied("no worker"))))
    assert billed == [] and val(m, "geniex:requests_total", model=M, outcome="error") == 1

    c, m, billed = accounted()
    task = asyncio.ensure_future(c.guard(asyncio.sleep(10)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert val(m, "geniex:requests_total", model=M, outcome="cancelled") == 1 and billed == []
    assert outcome_of(ClientGone("left")) == "cancelled" and outcome_of(WorkerDied("x")) == "error"


async def test_merged_streams_cancel_every_generation_when_closed_early() -> None:
    closed: list[int] = []

    async def generation(i: int) -> AsyncIterator[Delta | Done]:
        try:
            yield Delta(i, "x", 1)
            await asyncio.sleep(10)  # still generating when the client leaves
            yield Done(i, "stop", 1, 2)
        finally:
            closed.append(i)

    stream = merged([generation(0), generation(1), generation(2)])
    first = await anext(stream)
    assert first[1].text == "x"
    await stream.aclose()
    assert sorted(closed) == [0, 1, 2]

    # and a failing generation surfaces as the merged stream's error, the others closed
    closed.clear()

    async def failing() -> AsyncIterator[Delta | Done]:
        try:
            raise WorkerDied("gone")
            yield  # pragma: no cover
        finally:
            closed.append(9)

    with pytest.raises(WorkerDied):
        async for _ in merged([generation(0), failing()]):
            pass
    assert sorted(closed) == [0, 9]


def test_usage_ledger_failures_and_pending_rows_are_exported() -> None:
    m = Metrics(process=False)
    assert val(m, "geniex:usage_ledger_write_failures_total") == 0  # no ledger bound: no sample
    ledger = SimpleNamespace(write_failures=3, pending=2)
    m.watch(None, None, ledger)
    assert val(m, "geniex:usage_ledger_write_failures_total") == 3
    assert val(m, "geniex:usage_ledger_pending_rows") == 2
    ledger.write_failures, ledger.pending = 4, 0
    assert val(m, "geniex:usage_ledger_write_failures_total") == 4
    assert val(m, "geniex:usage_ledger_pending_rows") == 0


async def test_a_whole_answer_that_fails_or_is_left_bills_nothing_but_counts_its_tokens() -> None:
    """A non-streamed answer goes out whole at the end: one cut short gave its client no token,
    so the ledger bills none (the soak harness found 503s billed), while the metrics still count
    the work the worker did."""
    c, m, billed = accounted()
    with pytest.raises(WorkerDied):
        await c.guard(collect(c, shapers(), feed(Delta(1, "a", 1), Delta(1, "b", 6), WorkerDied("gone"))))
    assert billed == []
    assert val(m, "geniex:requests_total", model=M, outcome="error") == 1
    assert val(m, "vllm:generation_tokens_total", model=M) == 6

    c, m, billed = accounted()
    task = asyncio.ensure_future(c.guard(collect(c, shapers(), slow_after(Delta(1, "a", 2)))))
    while not c.tokens[0]:
        await asyncio.sleep(0)
    task.cancel()  # the client left
    with pytest.raises(asyncio.CancelledError):
        await task
    assert billed == [] and val(m, "geniex:requests_total", model=M, outcome="cancelled") == 1


async def slow_after(*msgs: Delta) -> AsyncIterator[tuple[int, Delta | Done]]:
    for msg in msgs:
        yield 0, msg
    await asyncio.sleep(60)
    yield 0, Done(1, "stop", 4, 3)
