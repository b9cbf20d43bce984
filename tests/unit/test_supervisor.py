"""The pool and the worker handle against real worker processes running the fake engine
(workers/engines/fake.py): streaming, queueing, refusals, cancellation, crashes, load
timeouts, core shares, eviction and keep-alive, each in about a second."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, get_args

import msgspec
import psutil
import pytest
import zmq.asyncio

from gateway.errors import (
    BadRequest,
    EngineFailure,
    GatewayTimeout,
    Overloaded,
    Unsupported,
    WorkerDied,
    WorkerUnavailable,
)
from gateway.models.store import ModelEntry
from gateway.ops.metrics import Metrics
from gateway.ops.settings import Settings
from gateway.supervisor.claims import Claims
from gateway.supervisor.handle import CALL_TIMEOUT_S, OneShot, WorkerHandle, _next
from gateway.supervisor.memory import estimate_worker_bytes
from gateway.supervisor.pool import WorkerPool
from gateway.supervisor.states import State
from protocol.events import WorkerChange
from protocol.keys import WorkerKey
from protocol.wire import Done, Embed, Generate, Started

MakePool = Callable[..., WorkerPool]


def fake_model(tmp_path: Path, name: str, **behaviour: Any) -> ModelEntry:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(behaviour))
    return ModelEntry(id=f"test/{name}:F", org="test", repo=name, precision="F", engine="fake", path=str(path),
                      size=1, created=0)  # fmt: skip


@pytest.fixture
async def make_pool(tmp_path: Path) -> AsyncIterator[MakePool]:
    pools: list[WorkerPool] = []

    def make(**settings: Any) -> WorkerPool:
        s = Settings(data_dir=tmp_path, **{"parallel": 2, "max_queue": 2, "keep_alive_s": -1.0, **settings})
        pool = WorkerPool(s, zmq.asyncio.Context(), Metrics(process=False))
        pool.start()
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        await pool.close()
        pool.zctx.destroy(linger=0)


async def worker(pool: WorkerPool, entry: ModelEntry) -> WorkerHandle:
    return await pool.get(pool.key_for(entry, None, None, None), entry)


def ask(max_tokens: int | None = None, prompt: str = "hi") -> Generate:
    return Generate(req_id=0, log_id="test", prompt=prompt, max_tokens=max_tokens)


async def answer(handle: WorkerHandle, msg: Generate) -> list[object]:
    return [m async for m in handle.generate(msg)]


async def until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_generation_streams_started_deltas_and_done(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool()
    h = await worker(pool, fake_model(tmp_path, "a", tokens=4))
    msgs = await answer(h, ask())
    assert isinstance(msgs[0], Started)
    assert [m.text for m in msgs[1:-1]] == ["tok1 ", "tok2 ", "tok3 ", "tok4 "]  # type: ignore[attr-defined]
    assert msgs[-1] == Done(msgs[-1].req_id, "stop", prompt_tokens=1, completion_tokens=4)  # type: ignore[attr-defined]
    msgs = await answer(h, ask(max_tokens=2))
    assert isinstance(msgs[-1], Done) and msgs[-1].finish_reason == "length" and msgs[-1].completion_tokens == 2
    assert h.status == "idle" and h.requests_served == 2


async def test_tokens_generated_counts_during_an_answer_and_once_in_all(make_pool: MakePool, tmp_path: Path) -> None:
    """/v1/workers' throughput comes from tokens_generated: it grows while an answer streams, ends
    at the answers' completion_tokens exactly, and counts a cancelled answer's overshoot once."""
    pool = make_pool()
    h = await worker(pool, fake_model(tmp_path, "t", tokens=1000, delay_ms=5))
    stream = h.generate(ask(max_tokens=200))
    for _ in range(6):  # Started and five Deltas
        await anext(stream)
    assert 5 <= h.tokens_generated < 200, "counted while the answer is under way"
    rest = [m async for m in stream]
    assert isinstance(rest[-1], Done) and h.tokens_generated == rest[-1].completion_tokens == 200
    cut = h.generate(ask())
    for _ in range(4):
        await anext(cut)
    await cut.aclose()
    await until(lambda: not h._cancelled)  # the worker's Done for the cancel came back
    done = await answer(h, ask(max_tokens=7))
    assert isinstance(done[-1], Done)
    assert h.tokens_generated >= 200 + 3 + 7, "the cancelled answer's tokens, overshoot included"
    before = h.tokens_generated
    await answer(h, ask(max_tokens=7))
    assert h.tokens_generated == before + 7


async def test_a_full_queue_is_overloaded_and_a_refusal_is_a_bad_request(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(parallel=1, max_queue=1)
    h = await worker(pool, fake_model(tmp_path, "q", tokens=50, delay_ms=10))
    running = asyncio.ensure_future(answer(h, ask()))
    queued = asyncio.ensure_future(answer(h, ask()))
    await until(lambda: h.inflight == 2)
    pool.claims.hold(h.key, 2)  # two more requests handed this worker: refused at capacity, each spends its claim
    for _ in range(2):
        with pytest.raises(Overloaded, match="at capacity"):
            await answer(h, ask())
    assert len(await running) == len(await queued) == 52
    with pytest.raises(BadRequest, match="refused, as asked"):
        await answer(h, ask(prompt="refuse"))
    assert h.inflight == 0 and h.idle, "no claim is left behind by a refusal"


async def test_a_bug_or_garbage_fails_one_request_and_the_worker_lives_on(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool()
    h = await worker(pool, fake_model(tmp_path, "bug", tokens=3))
    pid = h.pid
    with pytest.raises(EngineFailure, match="the worker failed this request"):
        await answer(h, ask(prompt="raise"))
    await h._push.send(b"\xff not a message")  # an undecodable message is logged and dropped
    assert isinstance((await answer(h, ask()))[-1], Done)
    assert h.pid == pid and h.status == "idle"


async def test_closing_a_generation_cancels_it_on_the_worker(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool()
    h = await worker(pool, fake_model(tmp_path, "c", tokens=1000, delay_ms=5))
    stream = h.generate(ask())
    await anext(stream)
    await anext(stream)
    await stream.aclose()
    assert h.inflight == 0
    assert len(await answer(h, ask(max_tokens=3))) == 5  # the slot was freed


async def test_a_crash_fails_every_request_at_once_and_a_crash_loop_backs_off(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = make_pool(crash_limit=2, crash_window_s=60.0, crash_backoff_s=30.0)
    entry = fake_model(tmp_path, "crash", tokens=100, delay_ms=5, crash_after=6)
    h = await worker(pool, entry)
    results = await asyncio.gather(answer(h, ask()), answer(h, ask()), return_exceptions=True)
    assert all(isinstance(r, WorkerDied) and "died (exited with status 3)" in r.message for r in results), results
    await until(lambda: h.key not in pool.workers)
    assert h.state is State.FAILED
    assert pool.metrics.registry.get_sample_value("geniex:worker_crashes_total", {"model": entry.id}) == 1
    h2 = await worker(pool, entry)
    assert h2 is not h
    with pytest.raises(WorkerDied):
        await answer(h2, ask())
    await until(lambda: h2.key not in pool.workers)
    with pytest.raises(Overloaded, match="crashed 2 times within 60s"):
        await worker(pool, entry)


async def test_a_worker_that_never_loads_times_out_and_is_killed(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(load_timeout_s=1.0)
    with pytest.raises(WorkerUnavailable, match="did not become ready within 1s"):
        await worker(pool, fake_model(tmp_path, "hang", hang_on_load=True))
    assert not pool.workers
    assert not [p for p in psutil.Process().children() if "fake" in " ".join(p.cmdline()) and p.status() != "zombie"]


async def test_busy_workers_share_the_cores_and_one_left_alone_gets_them_all(
    make_pool: MakePool, tmp_path: Path
) -> None:
    cores = psutil.cpu_count(logical=False) or 1
    if cores < 2:
        pytest.skip("needs two cores to share")
    pool = make_pool()
    a = await worker(pool, fake_model(tmp_path, "a", tokens=30, delay_ms=10))
    b = await worker(pool, fake_model(tmp_path, "b", tokens=300, delay_ms=10))
    long = asyncio.ensure_future(answer(b, ask()))
    await answer(a, ask())
    assert a.threads == b.threads == cores // 2  # shared while both decoded
    await until(lambda: b.threads == cores)  # a went idle: b gets every core back
    long.cancel()


async def test_eviction_waits_for_a_busy_worker_and_takes_the_idle_one(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(max_loaded=1)
    busy_entry = fake_model(tmp_path, "busy", tokens=60, delay_ms=10)
    a = await worker(pool, busy_entry)
    stream = asyncio.ensure_future(answer(a, ask()))
    await until(lambda: a.inflight == 1)
    starting = asyncio.ensure_future(worker(pool, fake_model(tmp_path, "next", tokens=2)))
    while not stream.done():  # the newcomer waits; `a` is not even asked to drain
        assert a.state is State.READY, "a busy worker is never chosen for eviction"
        await asyncio.sleep(0.005)
    b = await starting
    assert len(stream.result()) == 62, "the busy worker's generation ran to its end"
    assert list(pool.workers.values()) == [b] and a.state is State.STOPPED
    assert pool.metrics.registry.get_sample_value("geniex:worker_evictions_total", {"model": busy_entry.id}) == 1


async def test_a_slow_load_or_a_wait_for_room_never_holds_up_another_model(make_pool: MakePool, tmp_path: Path) -> None:
    """Starting a model takes no lock across its load or its wait for capacity: a model that
    takes 30 s to load, and another waiting for room, leave a third to start at once."""
    pool = make_pool(max_loaded=2)
    slow = asyncio.ensure_future(worker(pool, fake_model(tmp_path, "slow", load_s=30)))
    await until(lambda: len(pool.workers) == 1)
    busy = await worker(pool, fake_model(tmp_path, "busy", tokens=1000, delay_ms=5))
    stream = asyncio.ensure_future(answer(busy, ask()))
    await until(lambda: busy.inflight == 1)
    waiting = asyncio.ensure_future(worker(pool, fake_model(tmp_path, "waits", tokens=2)))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "two workers are loaded or loading, neither idle: no room yet"
    stream.cancel()
    await until(lambda: busy.inflight == 0)
    third = await asyncio.wait_for(waiting, 10)  # `busy` went idle and was evicted, `slow` still loads
    assert third.state is State.READY and not slow.done()
    slow.cancel()


async def test_a_worker_runs_isolated_in_the_gateways_private_folder(
    make_pool: MakePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python's isolated mode: no PYTHON* variables (a PYTHONPATH could put code into a worker)
    and not the working directory on sys.path; the cwd is the gateway's 0700 runtime folder."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "planted"))
    pool = make_pool()
    h = await worker(pool, fake_model(tmp_path, "iso", tokens=1))
    proc = psutil.Process(h.pid)
    assert proc.cmdline()[1] == "-I" and proc.cwd() == str(pool.runtime_dir)
    assert pool.runtime_dir.stat().st_mode & 0o777 == 0o700


async def test_keep_alive_zero_stops_a_worker_once_idle(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(keep_alive_s=0.0)
    h = await worker(pool, fake_model(tmp_path, "k", tokens=2))
    await answer(h, ask())
    await until(lambda: h.state is State.STOPPED and not pool.workers)


async def test_a_worker_handed_to_a_request_is_not_evicted_before_the_request_reaches_it(
    make_pool: MakePool, tmp_path: Path
) -> None:
    """A handler awaits between getting its worker and sending it the request; a start that needs
    the room in between waits instead of stopping that worker (soak: a 500 "worker is stopping")."""
    pool = make_pool(max_loaded=1)
    a = await worker(pool, fake_model(tmp_path, "a", tokens=2))
    assert not a.idle, "claimed by the request it was handed to"
    starting = asyncio.ensure_future(worker(pool, fake_model(tmp_path, "b", tokens=2)))
    await asyncio.sleep(0.5)
    assert a.state is State.READY and not starting.done()
    msgs = await answer(a, ask())  # admitted: the claim is spent, and once done `a` is idle
    assert isinstance(msgs[-1], Done)
    b = await asyncio.wait_for(starting, 5)
    assert a.state is State.STOPPED and list(pool.workers.values()) == [b]


async def test_a_claim_never_used_lapses_and_a_stopped_worker_asks_for_a_retry(
    make_pool: MakePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool(max_loaded=1)
    pool.claims.lapse_s = 0.2
    a = await worker(pool, fake_model(tmp_path, "a", tokens=2))  # its request failed before reaching it
    b = await asyncio.wait_for(worker(pool, fake_model(tmp_path, "b", tokens=2)), 5)
    assert a.state is State.STOPPED and b.state is State.READY
    with pytest.raises(Overloaded) as refused:  # a 503 with Retry-After, not a 500: nothing failed
        await answer(a, ask())
    assert refused.value.headers == {"Retry-After": "1"} and "was stopped" in refused.value.message


async def test_requests_waiting_on_a_start_that_fails_hold_no_claim(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(load_timeout_s=0.5)
    entry = fake_model(tmp_path, "h", hang_on_load=True)
    waiting = [asyncio.ensure_future(worker(pool, entry)) for _ in range(3)]
    await until(lambda: pool.claims.held(pool.key_for(entry, None, None, None)) == 3)
    for w in waiting:
        with pytest.raises(Exception, match="did not become ready"):
            await w
    assert pool.claims.held(pool.key_for(entry, None, None, None)) == 0


def test_claims_are_held_until_released_or_lapsed() -> None:
    now = [0.0]
    claims = Claims(lapse_s=5.0, clock=lambda: now[0])
    a, b = WorkerKey("a", "cpu", 512), WorkerKey("b", "cpu", 512)
    claims.hold(a, 2)
    claims.hold(b, 0)
    assert (claims.held(a), claims.held(b)) == (2, 0)
    claims.release(a)
    claims.release(b)  # nothing held: a no-op
    now[0] = 4.0
    claims.hold(a)
    assert claims.held(a) == 2
    now[0] = 6.0  # the first claim lapsed, the one taken at 4 s has not
    assert claims.held(a) == 1
    claims.release(a)
    assert claims.held(a) == 0


async def test_a_request_whose_worker_crashed_before_it_arrived_asks_for_a_retry(make_pool: MakePool,
                                                                                 tmp_path: Path) -> None:  # fmt: skip
    """Handed a worker that another request's crash (or a kill) ends before this one reaches it: a
    503 naming the cause, with Retry-After (a retry gets a fresh worker), not a 500: it did nothing."""
    pool = make_pool()
    h = await worker(pool, fake_model(tmp_path, "k", tokens=2))
    assert h.pid is not None
    psutil.Process(h.pid).kill()
    await until(lambda: h.state is State.FAILED)
    with pytest.raises(Overloaded) as refused:
        await answer(h, ask())
    assert refused.value.headers == {"Retry-After": "1"}
    assert "died (killed by SIGKILL) before this request reached it" in refused.value.message


async def test_a_draft_model_makes_room_as_a_worker_does_or_is_a_503(
    make_pool: MakePool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool()
    idle = await worker(pool, fake_model(tmp_path, "idle", tokens=2))
    await answer(idle, ask())
    target = await worker(pool, fake_model(tmp_path, "target", tokens=2))  # claimed by its request
    draft = fake_model(tmp_path, "draft").path
    need = estimate_worker_bytes(draft, target.key.nctx * target.spec.worker.parallel)
    monkeypatch.setattr(pool, "_available_bytes", lambda: need - 1)  # one byte short: `idle` must go
    await pool.add_draft(target, draft)
    assert draft in target.drafts and idle.state is State.STOPPED and target.state is State.READY
    with pytest.raises(Overloaded, match="draft model needs about"):  # nothing idle left to evict
        await pool.add_draft(target, fake_model(tmp_path, "draft2").path)
    assert target.state is State.READY and len(target.drafts) == 1


async def test_a_one_shot_call_without_an_answer_times_out_and_is_cancelled(make_pool: MakePool,
                                                                             tmp_path: Path) -> None:  # fmt: skip
    pool = make_pool()
    h = await worker(pool, fake_model(tmp_path, "e", embed_unanswered=True))
    with pytest.raises(GatewayTimeout, match=r"did not answer this embed request within 0\.5 s"):
        await h.call(Embed(0, "t", texts=["x"]), timeout=0.5)
    assert h.inflight == 0, "the request left the handle"
    msgs = await answer(h, ask(max_tokens=2))  # the worker still serves
    assert isinstance(msgs[-1], Done) and msgs[-1].completion_tokens == 2
    assert set(CALL_TIMEOUT_S) == set(get_args(OneShot)), "every one-shot kind has its timeout"


async def test_a_message_the_worker_cannot_read_is_refused_by_its_request_id(make_pool: MakePool,
                                                                              tmp_path: Path) -> None:  # fmt: skip
    pool = make_pool()
    h = await worker(pool, fake_model(tmp_path, "u"))
    req_id, pending = h._admit("t")
    # a request of a newer protocol: array_like and tagged, as every request is
    h._push.send(msgspec.msgpack.encode(["teleport", req_id, "somewhere"]))
    with pytest.raises(Unsupported, match="does not know the message 'teleport'"):
        await asyncio.wait_for(_next(pending.queue), 10)
    h._queues.pop(req_id, None)
    h._left()
    msgs = await answer(h, ask(max_tokens=1))
    assert isinstance(msgs[-1], Done), "and goes on serving"


async def test_the_pool_publishes_each_workers_states_in_order(make_pool: MakePool, tmp_path: Path) -> None:
    """What /v1/events streams (gateway/supervisor/events.py): a worker's life from the handle's
    own transitions, with its pid, and why it ended (evicted, crashed)."""
    pool = make_pool(max_loaded=1)
    sub = pool.hub.subscribe()
    first = fake_model(tmp_path, "first", tokens=2)
    a = await worker(pool, first)
    await answer(a, ask())
    b = await worker(pool, fake_model(tmp_path, "dies", tokens=100, delay_ms=5, crash_after=3))  # evicts a
    with pytest.raises(WorkerDied):
        await answer(b, ask())
    await until(lambda: b.key not in pool.workers)
    seen = [(e.model, e.state, e.pid, e.reason) for e in sub.take() if isinstance(e, WorkerChange)]
    assert [s for m, s, _, _ in seen if m == first.id] == ["loading", "ready", "busy", "idle", "stopping", "evicted"]
    assert [s for m, s, _, _ in seen if m == b.key.model] == ["loading", "ready", "busy", "crashed"]
    assert {pid for m, _, pid, _ in seen if m == first.id} == {a.pid} and a.pid is not None
    assert seen[-1][3] == "exited with status 3" and ("test/first:F", "evicted", a.pid, "evicted") in seen
    assert [s for _, s, _, _ in seen].index("evicted") < [s for _, s, _, _ in seen].index("crashed")
