"""Hung workers and request deadlines, against real worker processes running the fake engine: a
step that never returns and a stopped process are found within their bounds, their requests fail
naming it, the worker is killed and replaced (a crash, as the back-off counts), other models keep
serving; a long step within its bound is left alone; a deadline cancels a request and frees its slot."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import msgspec
import pytest

from gateway.errors import DeadlineExceeded, WorkerDied
from gateway.ops.accounting import outcome_of
from gateway.supervisor import deadline
from gateway.supervisor.liveness import Bounds, bounds_for, npu_call, verdict
from gateway.supervisor.states import State
from protocol import engines
from protocol.wire import Ready
from tests.unit.test_supervisor import MakePool, answer, ask, fake_model, make_pool, until, worker

__all__ = ["make_pool"]  # the pool fixture, shared with the supervisor tests


def test_the_verdict_reads_silence_and_a_long_step_and_nothing_else() -> None:
    b = Bounds(silence_s=10.0, step_s=60.0)
    assert verdict(100.0, 95.0, 0.0, 99.5, b) is None
    assert "sent nothing for 11 s" in (verdict(100.0, 89.0, 0.0, 89.0, b) or "")
    assert verdict(100.0, 99.5, 50.0, 99.5, b) is None  # a long step, within its bound
    assert "has run for 61 s" in (verdict(100.0, 99.0, 60.0, 99.0, b) or "")  # its last beat's age added
    assert verdict(1e6, 0.0, 1e6, 0.0, Bounds(0.0, 0.0)) is None  # both bounds off
    assert bounds_for("llama_cpp", 15.0, 0.0) == Bounds(15.0, engines.info("llama_cpp").step_bound_s)
    assert bounds_for("llama_cpp", 15.0, 7.0).step_s == 7.0  # --hang-step-s overrides the engine's


def _ready(engine: str, compute: str) -> Ready:
    return Ready(protocol_version=1, pid=1, engine=engine, compute=compute, n_ctx=512)


@pytest.mark.parametrize(
    ("engine", "compute", "call"),
    [
        ("onnx", "npu", "a QNN call"),
        ("ocr", "npu", "a QNN call"),
        ("llama_npu", "npu", "a QNN call"),
        ("llama_npu", "hybrid", "a QNN call"),  # QNN with some nodes on the CPU: its step still waits on QNN
        ("qairt", "npu", "a QNN call"),  # libGenie runs on QNN
        ("llama_cpp", "npu", "a call of llama.cpp's Hexagon backend"),  # FastRPC without QNN
        ("llama_cpp", "cpu", ""),  # an NPU chat worker that fell back to the CPU reports llama.cpp's engine
        ("onnx", "cpu", ""),  # QNN refused the model: it runs on the CPU
        ("llama_cpp", "gpu", ""),
    ],
)
def test_what_a_step_on_the_npu_waits_on_comes_from_the_workers_ready(engine: str, compute: str, call: str) -> None:
    assert npu_call(_ready(engine, compute)) == call
    assert npu_call(None) == ""  # not ready yet: never judged, but the call must not fail


def test_a_long_step_on_the_npu_is_reported_as_the_npus_hang_with_the_doctors_check() -> None:
    b = Bounds(silence_s=10.0, step_s=60.0)
    why = verdict(100.0, 99.0, 60.0, 99.0, b, npu="a QNN call") or ""
    assert why.startswith("the NPU did not return from a QNN call for 61 s, over its bound of 60 s: ")
    assert "FastRPC to the cDSP" in why and "`geniex doctor` (its npu.htp_run check)" in why
    assert verdict(100.0, 99.5, 50.0, 99.5, b, npu="a QNN call") is None  # within its bound, as any step
    # Silence is the process's, not the NPU's: a call that never returns leaves the heartbeat thread beating.
    assert "sent nothing for 11 s" in (verdict(100.0, 89.0, 0.0, 89.0, b, npu="a QNN call") or "")


async def test_a_step_that_never_returns_is_found_its_requests_fail_and_the_worker_is_replaced(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = make_pool(hang_step_s=2.0, hang_silence_s=30.0)
    stuck = fake_model(tmp_path, "stuck", tokens=50, delay_ms=5, hang_after=3)
    other = fake_model(tmp_path, "other", tokens=3)
    h = await worker(pool, stuck)
    healthy = await worker(pool, other)
    t0 = time.monotonic()
    results = await asyncio.gather(answer(h, ask()), answer(h, ask()), return_exceptions=True)
    took = time.monotonic() - t0
    assert all(isinstance(r, WorkerDied) and "made no progress" in r.message and "one step" in r.message
               for r in results), results  # fmt: skip
    assert 2.0 <= took < 2.0 + 3.0, took  # the bound, plus the check's second and a beat's
    await until(lambda: h.key not in pool.workers)
    assert h.state is State.FAILED and "hung" in (h.exit_reason or "")
    assert pool.metrics.registry.get_sample_value("geniex:worker_hangs_total", {"model": stuck.id}) == 1
    assert pool.metrics.registry.get_sample_value("geniex:worker_crashes_total", {"model": stuck.id}) == 1
    assert "hung" in pool.crashed[stuck.id]
    assert len(await answer(healthy, ask())) == 5  # the other model served throughout
    h2 = await worker(pool, stuck)  # the next request starts a new worker
    assert h2 is not h and h2.state is State.READY


async def test_a_hung_worker_on_the_npu_is_reported_as_the_npus_hang_everywhere_its_reason_goes(
    make_pool: MakePool, tmp_path: Path
) -> None:
    """The pool reads the unit from the worker's Ready; the reason reaches the requests' failure, the
    handle (`hung`, /v1/workers), its exit reason and the pool's `crashed` (/ready's `recovering`)."""
    pool = make_pool(hang_step_s=1.0, hang_silence_s=30.0)
    entry = fake_model(tmp_path, "npu-stuck", tokens=50, delay_ms=5, hang_after=3)
    h = await worker(pool, entry)
    assert h.ready_info is not None
    h.ready_info = msgspec.structs.replace(h.ready_info, compute="npu")  # the fake engine runs on the CPU
    results = await asyncio.gather(answer(h, ask()), return_exceptions=True)
    assert isinstance(results[0], WorkerDied) and "the NPU did not return from a QNN call" in results[0].message
    assert "npu.htp_run" in (h.hung or "")
    await until(lambda: h.key not in pool.workers)
    assert "the NPU did not return" in (h.exit_reason or "") and "npu.htp_run" in pool.crashed[entry.id]


async def test_a_stopped_process_is_found_by_its_silence_also_with_a_request_queued(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = make_pool(hang_silence_s=2.0, parallel=1, max_queue=2)
    entry = fake_model(tmp_path, "stopped", tokens=1000, delay_ms=20)
    h = await worker(pool, entry)
    running = asyncio.ensure_future(answer(h, ask()))
    queued = asyncio.ensure_future(answer(h, ask()))  # parallel 1: this one waits in the worker's queue
    await until(lambda: h.tokens_generated > 3)
    assert h.pid is not None
    os.kill(h.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    results = await asyncio.gather(running, queued, return_exceptions=True)
    assert all(isinstance(r, WorkerDied) and "sent nothing" in r.message for r in results), results
    assert time.monotonic() - t0 < 2.0 + 3.0
    await until(lambda: h.key not in pool.workers)
    assert h.state is State.FAILED


async def test_a_long_step_within_its_bound_and_an_idle_worker_are_left_alone(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = make_pool(hang_step_s=3.0, hang_silence_s=2.0)
    entry = fake_model(tmp_path, "slow", tokens=3, slow_step_s=1.5)  # steps of 1.5 s, beats each second
    h = await worker(pool, entry)
    msgs = await answer(h, ask())
    assert len(msgs) == 5 and h.hung is None
    await asyncio.sleep(3.0)  # idle, beating: nobody waits, nothing is judged
    assert h.state is State.READY and h.hung is None and h.beat.steps > 0
    assert pool.metrics.registry.get_sample_value("geniex:worker_hangs_total", {"model": entry.id}) in (None, 0.0)


async def test_a_deadline_cancels_the_request_on_its_worker_and_frees_the_slot(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = make_pool(parallel=1, max_queue=0)
    entry = fake_model(tmp_path, "long", tokens=10_000, delay_ms=10)
    h = await worker(pool, entry)
    token = deadline.start(0.5)
    try:
        with pytest.raises(DeadlineExceeded, match=r"limit of 0\.5 s") as e:
            await answer(h, ask())
    finally:
        deadline.DEADLINE.reset(token)
    assert outcome_of(e.value) == "cancelled" and e.value.status == 504
    await until(lambda: h.inflight == 0)
    msgs = await answer(h, ask(max_tokens=2))  # the only slot is free again: the cancel reached the worker
    assert msgs[-1].finish_reason == "length"  # type: ignore[attr-defined]
