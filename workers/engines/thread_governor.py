"""How many threads llama.cpp should decode with right now, on a machine it shares.

llama.cpp's threads meet at a barrier after every operation and spin while they wait. When
another program keeps a core busy, one of our threads is preempted for a whole time slice
while the others spin, and decoding collapses: measured on 2 cores with SmolLM2-135M, bare
decode steps of 6.7 ms idle became 14 ms with one busy process and 3,000 ms with two, while
one thread stayed at 10-11 ms under both (bench/README.md, "Contention"). So the governor
uses only the cores nobody else is using:

- Four times a second while decoding (and twice a second while idle, and afresh when work
  starts) it reads how much CPU the rest of the machine used (system busy time minus this
  process's own, steal included) and sets the thread count to the cores left over, within
  the cap the gateway sets (`SetThreads` shares the cores between busy workers).
- Fewer threads take effect at once. More threads are a trial: if the next steps are not
  faster than the last ones with fewer threads (same batch size), it goes back and waits
  before trying again (1 s, doubling up to a minute), so a misjudged core never costs more
  than a few steps.
- Steps far slower than the best seen with the same threads and batch size (the cores are
  not ours even though the CPU accounting did not say so: a CPU quota, a burst) also lower
  the count.

Everything here is arithmetic on numbers handed in; `CpuClock` reads the real ones.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from collections.abc import Callable

import psutil

SAMPLE_S = 0.25  # how often the machine's CPU use is read while decoding
FIRST_SAMPLE_S = 0.05  # the shortest reading taken when a step follows idle time (a fresh look, not the last idle one)
SLACK = 0.35  # a core counts as free when others use less than this much of it (the gateway, the client)
TRIAL_STEPS = 4  # steps with one more thread before judging it
TRIAL_GAIN = 0.95  # more threads stay only if their steps take at most this fraction of the fewer threads'
SLOW = 2.5  # a median step this many times the best one (same threads and batch) means contention
RECENT = 5  # steps in that median
BEST_DRIFT = 1.01  # the best step time may rise this much per step (a growing context costs more)
HOLD_MIN_S, HOLD_MAX_S = 1.0, 60.0


class CpuClock:
    """(wall seconds, CPU seconds used machine-wide, CPU seconds used by this process)."""

    def __call__(self) -> tuple[float, float, float]:
        t = psutil.cpu_times()
        idle = t.idle + getattr(t, "iowait", 0.0)
        # Linux counts guest time inside user/nice already.
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        own = os.times()
        return time.monotonic(), total - idle, own.user + own.system


def runnable_now() -> int | None:
    """Threads runnable on the machine at this instant (Linux's procs_running), or None elsewhere."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class ThreadGovernor:
    def __init__(self, cap: int, cpus: int | None = None,
                 clock: Callable[[], tuple[float, float, float]] | None = None,
                 runnable: Callable[[], int | None] = runnable_now) -> None:  # fmt: skip
        self.cap = max(1, cap)
        self.threads = self.cap
        self.cpus = cpus or psutil.cpu_count() or os.cpu_count() or 1
        self.others = 0.0  # CPUs' worth the rest of the machine used in the last sample window
        self._clock = clock or CpuClock()
        self._runnable = runnable
        self._last = self._clock()
        self._steps: deque[tuple[int, int, float]] = deque(maxlen=16)  # (threads, batch tokens, seconds)
        self._best: dict[tuple[int, int], float] = {}
        # While trying one more thread: the thread count before, and its median step per batch size.
        self._trial: tuple[int, dict[int, float]] | None = None
        self._trial_steps = 0
        self._hold_until = 0.0
        self._hold = HOLD_MIN_S
        self._idle = False
        # The count came from a short reading right after idle time, which mostly shows the past: the
        # engine keeps its next step short, so that a reading of the present decides soon.
        self.tentative = False

    @property
    def now(self) -> float:
        return self._last[0]

    def set_cap(self, cap: int) -> None:
        """The gateway's share of the cores for this worker; more threads still wait for free cores."""
        self.cap = max(1, cap)
        if self.threads > self.cap:
            self.threads = self.cap
            self._trial = None

    def idle(self) -> None:
        """Called while the engine has no work: read the machine now and then, so the reading
        is never older than the idle poll when work arrives."""
        self._idle = True
        self.sample()

    def sample(self, shortest: float = SAMPLE_S) -> None:
        """Read the machine's CPU use if the last reading is at least `shortest` seconds old."""
        now = self._clock()
        wall = now[0] - self._last[0]
        if wall < shortest:
            return
        self.others = max(0.0, ((now[1] - self._last[1]) - (now[2] - self._last[2])) / wall)
        self._last = now
        self.tentative = False
        wanted = self._free_cores(self.others)
        if shortest < SAMPLE_S and wanted < self.threads and (running := self._runnable()) is not None:
            # A short reading after idle time mostly covers the past: a program that was busy until
            # this request came counts in it. What runs right now (besides this thread) decides.
            wanted = max(wanted, self._free_cores(max(0, running - 1)))
        if wanted < self.threads:
            self._trial = None
            self.threads = wanted
        elif wanted > self.threads and self._trial is None and self.now >= self._hold_until:
            self._trial = (self.threads, self._medians(self.threads))
            self._trial_steps = 0
            self.threads += 1

    def _free_cores(self, others: float) -> int:
        return max(1, min(self.cap, int(self.cpus - others + SLACK)))

    def threads_for_step(self) -> int:
        if self._idle:  # the first step after idle time: what happened since the last idle reading
            self._idle = False
            self.sample(FIRST_SAMPLE_S)
            self.tentative = self.threads < self.cap
        elif self.tentative:  # the first step's own window: the present only
            self.sample(FIRST_SAMPLE_S)
        else:
            self.sample()
        return self.threads

    def after_step(self, tokens: int, seconds: float) -> None:
        """Record one decode step of `tokens` batch tokens, run at the current thread count."""
        key = (self.threads, tokens)
        best = self._best.get(key)
        self._best[key] = seconds if best is None else min(seconds, best * BEST_DRIFT)
        self._steps.append((self.threads, tokens, seconds))
        if self._trial is not None:
            self._trial_steps += 1
            if self._trial_steps >= TRIAL_STEPS:
                self._judge_trial()
        elif self.threads > 1 and best is not None:
            recent = [s for t, k, s in list(self._steps)[-RECENT:] if (t, k) == key]
            if len(recent) == RECENT and statistics.median(recent) > SLOW * best:
                self.threads -= 1
                self._back_off()

    # ---- decisions ---------------------------------------------------------

    def _judge_trial(self) -> None:
        assert self._trial is not None
        fewer, before = self._trial
        self._trial = None
        tried = list(self._steps)[-self._trial_steps :]
        ratios = [s / before[k] for _t, k, s in tried if before.get(k)]
        if ratios and statistics.median(ratios) > TRIAL_GAIN:
            self.threads = fewer
            self._back_off()
        else:
            self._hold = HOLD_MIN_S

    def _back_off(self) -> None:
        self._hold_until = self.now + self._hold
        self._hold = min(HOLD_MAX_S, self._hold * 2)

    def _medians(self, threads: int) -> dict[int, float]:
        """The median of the recent steps run with `threads`, per batch size."""
        by_tokens: dict[int, list[float]] = {}
        for t, k, s in self._steps:
            if t == threads:
                by_tokens.setdefault(k, []).append(s)
        return {k: statistics.median(v) for k, v in by_tokens.items()}
