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
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol import engines


@dataclass(frozen=True)
class Bounds:
    silence_s: float  # 0: never judged by silence
    step_s: float  # 0: never judged by a long step


def bounds_for(engine: str, silence_s: float, step_override_s: float) -> Bounds:
    return Bounds(silence_s, step_override_s or engines.info(engine).step_bound_s)


def verdict(now: float, last_heard: float, step_s: float, beat_at: float, b: Bounds) -> str | None:
    """Why a worker with requests in flight is hung (None: it is not). `last_heard`: when it last
    sent anything; `step_s`, `beat_at`: the running step's age in its last beat, and when that came."""
    silent = now - last_heard
    if b.silence_s and silent > b.silence_s:
        return f"it sent nothing for {silent:.0f} s, not even its heartbeat (the process is stopped or deadlocked)"
    running = step_s + (now - beat_at) if step_s else 0.0
    if b.step_s and running > b.step_s:
        return f"one step of its engine has run for {running:.0f} s, over its bound of {b.step_s:g} s"
    return None
