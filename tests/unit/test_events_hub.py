"""The /v1/events hub (gateway/supervisor/events.py): order, a bounded backlog per subscriber with
a `dropped` marker, the subscriber cap, and closing on a drain."""

from __future__ import annotations

import asyncio
import tracemalloc

import msgspec
import pytest

from gateway.errors import Overloaded
from gateway.supervisor.events import EventHub
from protocol.events import Dropped, WorkerChange


def change(i: int) -> WorkerChange:
    return WorkerChange(model="m", worker=f"m@cpu:{i}", state="busy", pid=i, compute="cpu", nctx=512, at=float(i))


def test_a_reader_gets_every_event_in_order() -> None:
    async def main() -> None:
        hub = EventHub(cap=8)
        sub = hub.subscribe()
        assert await sub.next(timeout=0.01) == []  # nothing yet: a keep-alive's turn
        for i in range(5):
            hub.publish(change(i))
        got = await sub.next(timeout=1)
        assert [e.pid for e in got if isinstance(e, WorkerChange)] == [0, 1, 2, 3, 4]
        waiter = asyncio.create_task(sub.next(timeout=5))
        await asyncio.sleep(0)
        hub.publish(change(9))  # wakes a reader that waits
        assert [e.pid for e in await waiter if isinstance(e, WorkerChange)] == [9]

    asyncio.run(main())


def test_a_subscriber_that_never_reads_keeps_at_most_its_cap_and_is_told_what_it_lost() -> None:
    async def main() -> None:
        hub = EventHub(cap=100)
        stalled, reader = hub.subscribe(), hub.subscribe()
        for i in range(1_000):
            hub.publish(change(i))
            if i % 10 == 0:
                reader.take()  # a client that keeps up loses nothing
        assert len(stalled) == 100
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        for i in range(1_000, 50_000):
            hub.publish(change(i))
        after, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(stalled) == 100
        assert after - before < 64 * 1024, "memory grew with the events published, not with the cap"
        got = await stalled.next(timeout=1)
        assert got[0] == Dropped(count=50_000 - 100)
        assert [e.pid for e in got[1:] if isinstance(e, WorkerChange)] == list(range(49_900, 50_000))
        assert stalled.take() == []  # the count starts again
        hub.publish(change(1))
        assert [type(e) for e in reader.take()][-1] is WorkerChange and not any(
            isinstance(e, Dropped) for e in reader.take()
        )

    asyncio.run(main())


def test_subscribers_are_capped_and_a_drain_ends_every_stream() -> None:
    async def main() -> None:
        hub = EventHub(cap=4, max_subscribers=2)
        a, b = hub.subscribe(), hub.subscribe()
        with pytest.raises(Overloaded):
            hub.subscribe()
        waiter = asyncio.create_task(a.next(timeout=30))
        await asyncio.sleep(0)
        hub.close()
        assert await asyncio.wait_for(waiter, 1) == [] and a.closed and b.closed and hub.subscribers == 0
        hub.publish(change(1))  # nobody left to hold it
        assert len(a) == 0
        hub.subscribe()  # room again

    asyncio.run(main())


def test_the_route_sends_the_snapshot_then_keep_alives_and_changes_and_ends_on_a_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from litestar.response.sse import ServerSentEventMessage

    from gateway.dialects.geniex import events as route

    monkeypatch.setattr(route, "KEEPALIVE_S", 0.02)

    async def main() -> None:
        hub = EventHub(cap=4)
        sub = hub.subscribe()
        stream = route._stream(hub, sub, [change(1)])
        assert msgspec.json.decode(await anext(stream))["pid"] == 1  # type: ignore[arg-type]
        alive = await anext(stream)
        assert isinstance(alive, ServerSentEventMessage) and alive.encode() == b": keep-alive\r\n\r\n"
        hub.publish(change(2))
        got = await anext(stream)
        assert msgspec.json.decode(got)["pid"] == 2  # type: ignore[arg-type]
        hub.close()
        with pytest.raises(StopAsyncIteration):
            while True:
                await anext(stream)
        assert hub.subscribers == 0

    asyncio.run(main())
