"""The worker's heartbeat: a thread that tells the gateway, once a second, that the process runs
and how far its loop has got (protocol/wire.py's Beat).

It has its own PUSH socket (a ZeroMQ socket belongs to one thread), connected to the same outbox
as the loop's. The loop only bumps two numbers around each engine step, so a token costs nothing
extra. A process that is stopped, or whose every thread is stuck (a deadlock holding the GIL),
beats no more; a loop stuck inside one engine call (a driver that never returns: llama.cpp,
onnxruntime and ctypes release the GIL there) still beats, with `step_s` growing. The gateway
judges both (gateway/supervisor/liveness.py).
"""

from __future__ import annotations

import threading
import time

import zmq

from protocol.wire import Beat, worker_codec

BEAT_S = 1.0


class Progress:
    """What the loop has done: steps finished, and when the running one began (None: not in one)."""

    __slots__ = ("step_began", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.step_began: float | None = None

    def begin(self) -> None:
        self.step_began = time.monotonic()

    def end(self) -> None:
        self.steps += 1
        self.step_began = None

    def beat(self) -> Beat:
        began = self.step_began  # read once: the loop may clear it meanwhile
        return Beat(self.steps, round(time.monotonic() - began, 3) if began is not None else 0.0)


class Heartbeat:
    def __init__(self, ctx: zmq.Context, outbox: str, progress: Progress, interval_s: float = BEAT_S) -> None:
        self.progress = progress
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._sock = ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 4)  # beats nobody reads are not worth keeping
        self._sock.connect(outbox)
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        encode = worker_codec().encode
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    self._sock.send(encode(self.progress.beat()), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # the gateway is not reading: it will judge us by the silence
        finally:
            self._sock.close(0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s)
