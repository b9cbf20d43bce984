"""What each answer cost in energy: the machine's draw, as the OS reports it, shared among the
requests that were running while it was drawn.

The counter is the whole machine's (RAPL's package or platform zone, or a discharging battery:
protocol/power.py), so it holds whatever else ran beside the server too; no per-process figure
exists for a CPU, a GPU and an NPU together. It is read when a request starts running (its worker
admitted it), when one ends, and every `interval` seconds between, and the energy of each interval
between two reads is split equally among the requests running during it. An answer's `energy_j`
is then its share of what the machine drew while it ran; two answers at once on two cores each
carry half of both intervals, and one alone carries all of an idle machine's baseline. Equal
shares rather than shares by tokens: a prompt being prefilled shows no tokens until its first
one, and would be charged nothing for the costliest part of its work.

Where nothing can be read (a desktop whose RAPL counters are root-only, a VM, a laptop on its
charger without RAPL), there is no meter and `energy_j` is omitted, never a guessed 0. A request
that ran through any interval the counter could not read is omitted too.
"""

from __future__ import annotations

import asyncio
import weakref

import structlog

from protocol.power import EnergyCounter, find_power, sysfs_root

log = structlog.get_logger("gateway.ops.energy")

SAMPLE_S = 1.0  # a battery's power is integrated between reads, so read it about this often


class Share:
    """One request's part of the machine's energy, from when it started running to `end()`."""

    __slots__ = ("__weakref__", "_meter", "ended", "joules", "known")

    def __init__(self, meter: EnergyMeter) -> None:
        self._meter = meter
        self.joules = 0.0
        self.known = True
        self.ended = False

    def end(self) -> float | None:
        """Stop counting (the answer is shaped); its joules, or None where they are not known.
        Later calls give the same figure."""
        if not self.ended:
            self._meter.leave(self)
            self.ended = True
        return round(self.joules, 4) if self.known else None


class EnergyMeter:
    def __init__(self, counter: EnergyCounter | None) -> None:
        self.counter = counter
        self.source = counter.source if counter is not None else ""
        # Weak: a request that never ends its share (a path that forgot) leaves with its Accounting,
        # rather than diluting every later answer's share for the server's life.
        self._running: weakref.WeakSet[Share] = weakref.WeakSet()
        self._last = counter.read() if counter is not None else None

    @classmethod
    def for_this_machine(cls) -> EnergyMeter:
        """A meter on what this machine reports (protocol/power.py), or one that measures nothing."""
        probe = find_power(sysfs_root())
        if not probe.readable:
            log.info("energy per answer not measured", reasons=probe.notes)
            return cls(None)
        counter = EnergyCounter(probe)
        log.info("energy per answer measured", source=counter.source)
        return cls(counter)

    @property
    def enabled(self) -> bool:
        return self.counter is not None

    def begin(self) -> Share | None:
        """A request started running: its share from now on (None: nothing is measured here)."""
        if self.counter is None:
            return None
        self.sample()
        share = Share(self)
        self._running.add(share)
        return share

    def leave(self, share: Share) -> None:
        self.sample()
        self._running.discard(share)

    def sample(self) -> None:
        """Split the energy drawn since the last read among the requests running."""
        if self.counter is None:
            return
        now = self.counter.read()
        last, self._last = self._last, now
        if not self._running:
            return
        if now is None or last is None:
            for share in self._running:
                share.known = False
            return
        each = max(0.0, now - last) / len(self._running)
        for share in self._running:
            share.joules += each

    async def run(self, interval: float = SAMPLE_S) -> None:
        """Read the counter while requests run (the app's lifespan runs this; idle, it costs a wake-up
        a second and no read)."""
        while True:
            await asyncio.sleep(interval)
            if self._running:
                self.sample()
