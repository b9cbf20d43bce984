"""The gateway's sends to a worker: a frame sent before the worker's inbox is connected waits for the
connection instead of being dropped (a fresh worker's `Ready` can arrive first; the dropped request
then hung until its client gave up), and frames keep their order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq
import zmq.asyncio

from gateway.supervisor.handle import send_in_order


async def test_frames_sent_before_the_worker_connects_arrive_in_order(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    push = ctx.socket(zmq.PUSH)
    pull = ctx.socket(zmq.PULL)
    try:
        push.setsockopt(zmq.LINGER, 0)
        push.bind(f"ipc://{tmp_path / 'w.in'}")
        for i in range(3):  # no peer yet: a non-blocking send is refused here
            send_in_order(push, b"%d" % i)
        await asyncio.sleep(0.05)
        pull.connect(f"ipc://{tmp_path / 'w.in'}")
        send_in_order(push, b"3")
        async with asyncio.timeout(10):
            got = [await pull.recv() for _ in range(4)]
        assert got == [b"0", b"1", b"2", b"3"]
    finally:
        pull.close(0)
        push.close(0)
        ctx.term()


async def test_a_frame_still_waiting_when_the_socket_closes_is_dropped_quietly(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.bind(f"ipc://{tmp_path / 'w.in'}")
    send_in_order(push, b"never read")  # the worker died before it connected
    push.close(0)
    await asyncio.sleep(0)
    ctx.term()
