"""Whether a worker is making progress, judged from what it sends (gateway/supervisor/handle.py).

Every worker beats once a second from a thread of its own (workers/heartbeat.py), saying how many
steps its loop has finished and how long the current one has run. With requests in flight, a
worker is hung when

- it has sent nothing at all, not even a beat, for `silence_s`: the process is stopped (SIGSTOP, a
  debugger), swapped out for good, or every thread is stuck (a deadlock holding the GIL); or
- one step of its loop has run for longer than its engine's bound (protocol/engines.py's
  `step_bound_s`, or `--hang-step-s`): a call into the engine that does not return (a driver, a
  runtime, a tokenizer), while the process itself still runs.

A worker waiting for nothing is never judged: an idle one beats all the same, but nobody waits on it.

A long step of a worker on the NPU is the NPU's: its engine thread waits in a call that FastRPC has
sent to the Hexagon DSP (the cDSP), which on some Linux Snapdragon X Elite/X2 firmware never comes
back. Its reason says so and names the `geniex doctor` check that tries one round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol import engines
from protocol.wire import Ready

# What an operator can do about a hung NPU call: the doctor's check that runs one graph on the HTP.
NPU_HANG_ADVICE = (
    "FastRPC to the cDSP can hang on some Linux X Elite/X2 firmware; run `geniex doctor` (its npu.htp_run check)"
)


@dataclass(frozen=True)
class Bounds:
    silence_s: float  # 0: never judged by silence
    step_s: float  # 0: never judged by a long step


def bounds_for(engine: str, silence_s: float, step_override_s: float) -> Bounds:
    return Bounds(silence_s, step_override_s or engines.info(engine).step_bound_s)


def npu_call(ready: Ready | None) -> str:
    """What a worker's engine step waits on when it runs on the NPU, as its Ready says ("": not on the
    NPU). llama.cpp's own Hexagon backend (`npu` with llama.cpp) talks to the DSP without QNN; every
    other NPU worker calls QNN: the ONNX and OCR engines, the NPU chat engine (`npu`, or `hybrid`:
    QNN with CPU nodes beside it), and a Genie bundle, whose libGenie runs on QNN (NPU-only, so its
    engine says it whatever the unit). An NPU chat worker that fell back reports llama.cpp on the CPU."""
    if ready is None:
        return ""
    if ready.engine == "llama_cpp":
        return "a call of llama.cpp's Hexagon backend" if ready.compute == "npu" else ""
    if ready.compute in ("npu", "hybrid") or engines.info(ready.engine).npu_only:
        return "a QNN call"
    return ""


def verdict(now: float, last_heard: float, step_s: float, beat_at: float, b: Bounds, *, npu: str = "") -> str | None:
    """Why a worker with requests in flight is hung (None: it is not). `last_heard`: when it last
    sent anything; `step_s`, `beat_at`: the running step's age in its last beat, and when that came;
    `npu`: what its step waits on when the worker runs on the NPU (npu_call), "" when it does not."""
    silent = now - last_heard
    if b.silence_s and silent > b.silence_s:
        return f"it sent nothing for {silent:.0f} s, not even its heartbeat (the process is stopped or deadlocked)"
    running = step_s + (now - beat_at) if step_s else 0.0
    if b.step_s and running > b.step_s:
        over = f"for {running:.0f} s, over its bound of {b.step_s:g} s"
        if npu:
            return f"the NPU did not return from {npu} {over}: {NPU_HANG_ADVICE}"
        return f"one step of its engine has run {over}"
    return None
