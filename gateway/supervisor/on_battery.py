"""`--on-battery`: what the server does differently while the laptop runs from its battery.

- `cap-threads`: the CPU workers decode with at most half the cores (the pool's core shares are
  capped), so a long generation does not hold every core at full clock on battery;
- `prefer-npu`: a request that names no `compute` unit (and a server without `--compute`) asks
  for the NPU, which draws a fraction of the CPU's power per token; a model or host without one
  runs where it did, with the usual fallback warning;
- `none` (the default): nothing changes.

The power source is read every POLL_S (protocol/power.py: sysfs, or psutil where there is none);
a change is logged with the policy it applies, and `/v1/workers` shows both. Workers already
running on the CPU stay where they are under `prefer-npu` (a request in flight is never moved);
the next request that names no unit goes to the NPU's worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import structlog

from protocol.power import battery_state, sysfs_root

log = structlog.get_logger("gateway.supervisor.on_battery")

POLL_S = 5.0


class PowerInfo(msgspec.Struct):
    """What `/v1/workers` shows of it."""

    source: str  # battery, mains, or unknown (no battery, or the OS cannot tell)
    policy: str
    applied: bool  # the policy is in force now (on battery, and not `none`)
    since_s: float  # seconds since the source was last seen to change (or the server started)


def _read_source() -> bool | None:
    return battery_state(sysfs_root() / "sys" / "class" / "power_supply")


class BatteryPolicy:
    def __init__(self, policy: str, read: Callable[[], bool | None] = _read_source,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.policy = policy
        self._read = read
        self._clock = clock
        self.on_battery: bool | None = read() if policy != "none" else None
        self._since = clock()

    @property
    def applied(self) -> bool:
        return self.policy != "none" and bool(self.on_battery)

    def thread_cap(self, cores: int) -> int | None:
        """The most threads a CPU worker gets now (None: no cap of this policy's)."""
        return max(1, cores // 2) if self.applied and self.policy == "cap-threads" else None

    def compute(self, requested: str | None) -> str | None:
        """The unit a request that names `requested` (None: none) asks for now."""
        return "npu" if requested is None and self.applied and self.policy == "prefer-npu" else requested

    def info(self) -> PowerInfo:
        source = "unknown" if self.on_battery is None else "battery" if self.on_battery else "mains"
        return PowerInfo(source, self.policy, self.applied, round(self._clock() - self._since, 3))

    def check(self) -> bool:
        """Read the power source again; True when it changed."""
        now = self._read()
        if now == self.on_battery:
            return False
        self.on_battery, self._since = now, self._clock()
        source = "unknown" if now is None else "battery" if now else "mains"
        log.info("power source changed", source=source, policy=self.policy, applied=self.applied)
        return True

    async def watch(self, on_change: Callable[[], None], interval: float = POLL_S) -> None:
        """Poll the source for the server's life (the app's lifespan runs this unless the policy is `none`)."""
        while True:
            await asyncio.sleep(interval)
            try:
                changed = await asyncio.to_thread(self.check)
            except Exception:  # a sysfs read that fails is retried at the next poll
                log.exception("power source not read")
                continue
            if changed:
                on_change()
