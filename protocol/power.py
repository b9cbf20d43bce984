"""What the OS says of this machine's power: whether it runs from its battery (read by the workers,
for the NPU's performance mode and thread spinning, by `geniex doctor`, and by the gateway's
on-battery policy), and how much energy it draws (RAPL counters, or a discharging battery's power),
read by the gateway's energy meter (gateway/ops/energy.py) and bench/field.py alike. Every sysfs
path is read under a root, so that tests can hand in a fake tree (`GENIEX_SYSFS_ROOT` for a server).
"""

from __future__ import annotations

import os
import platform
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

POWER_SUPPLIES = Path("/sys/class/power_supply")  # Linux's power_supply class
# `--on-battery`'s policies (gateway/supervisor/on_battery.py)
ON_BATTERY_POLICIES = ("none", "cap-threads", "prefer-npu")


def battery_state(power_supplies: Path = POWER_SUPPLIES) -> bool | None:
    """True on battery, False on mains with a battery, None with no battery (a desktop) or when the
    OS cannot tell. Linux's power_supply class: a battery and no mains supply online. Where the class
    is absent (Windows on Arm), psutil asks the OS."""
    if not power_supplies.is_dir():
        return _os_battery_state()
    kinds = {p: _read(p / "type") for p in power_supplies.glob("*")}
    if "Battery" not in kinds.values():
        return None
    return not any(kind == "Mains" and _read(p / "online") == "1" for p, kind in kinds.items())


def on_battery(power_supplies: Path = POWER_SUPPLIES) -> bool:
    """A machine with no battery, or one that cannot tell, counts as on mains."""
    return bool(battery_state(power_supplies))


def _os_battery_state() -> bool | None:
    try:
        battery = psutil.sensors_battery()
    except (AttributeError, OSError, RuntimeError):  # a platform psutil has no battery sensor for
        return None
    if battery is None or battery.power_plugged is None:  # no battery, or the OS cannot tell
        return None
    return not battery.power_plugged


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def sysfs_root() -> Path:
    """Where this process reads /sys from: `/`, or a fake tree a test names in GENIEX_SYSFS_ROOT."""
    return Path(os.environ.get("GENIEX_SYSFS_ROOT") or "/")


# ---- energy: RAPL counters and discharging batteries ------------------------------------------


@dataclass(frozen=True)
class RaplZone:
    name: str  # package-0, psys, ...
    energy: Path  # energy_uj, a counter of microjoules
    max_uj: int  # where the counter wraps (max_energy_range_uj); 0: unknown


@dataclass
class PowerProbe:
    """What this machine reports about its power draw, and why not where it does not."""

    rapl: list[RaplZone] = field(default_factory=list)
    batteries: list[Path] = field(default_factory=list)  # discharging ones only: a charging
    notes: list[str] = field(default_factory=list)  # battery's power is not the machine's draw

    @property
    def readable(self) -> bool:
        return bool(self.rapl or self.batteries)


def _text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip().strip("\x00")
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text) if text else None
    except ValueError:
        return None


def rapl_zones(root: Path) -> tuple[list[RaplZone], str | None]:
    """The RAPL zones that add up to the machine's draw once each, or why there are none.

    `psys` (the whole platform, on laptops that have it) alone where present: it contains the
    packages. Otherwise the top-level zones (intel-rapl:N, the packages; AMD's driver uses the same
    names). Sub-zones (intel-rapl:0:0, the cores) are inside their package, and intel-rapl-mmio
    mirrors the package through MMIO: reading them too would count the same joules twice.
    """
    base = root / "sys" / "class" / "powercap"
    dirs = sorted(p for p in base.glob("*rapl*:*") if re.fullmatch(r"[a-z-]*rapl:\d+", p.name) and "mmio" not in p.name)
    if not dirs:
        return [], "no RAPL counters (/sys/class/powercap/intel-rapl:* absent: not Linux on Intel/AMD, or a VM)"
    zones, unreadable = [], []
    for d in dirs:
        try:
            int((d / "energy_uj").read_text())
        except (OSError, ValueError):  # PermissionError above all: root-only since CVE-2020-8694
            unreadable.append(d.name)
            continue
        zones.append(RaplZone(_text(d / "name") or d.name, d / "energy_uj", _int(d / "max_energy_range_uj") or 0))
    if not zones:
        return [], (f"RAPL counters present ({', '.join(unreadable)}) but unreadable by this user: energy_uj is "
                    "root-only on most kernels since 2020 (run as root, or `sudo chmod a+r "
                    "/sys/class/powercap/intel-rapl:*/energy_uj` for this boot)")  # fmt: skip
    platform_zones = [z for z in zones if z.name == "psys"]
    return platform_zones or zones, None


def power_supplies(root: Path) -> dict[str, dict[str, str]]:
    """/sys/class/power_supply/*: each supply's type, status, online (what is there of them)."""
    out = {}
    for d in sorted((root / "sys" / "class" / "power_supply").glob("*")):
        out[d.name] = {k: v for k in ("type", "status", "online") if (v := _text(d / k)) is not None}
    return out


def battery_watts(d: Path) -> float | None:
    """One battery's draw in W: power_now (µW), else current_now (µA) x voltage_now (µV)."""
    p = _int(d / "power_now")
    if p is not None:
        return abs(p) / 1e6
    c, v = _int(d / "current_now"), _int(d / "voltage_now")
    if c is not None and v is not None:
        return abs(c) * v / 1e12
    return None


def discharging(d: Path) -> bool:
    return _text(d / "status") == "Discharging"


def find_power(root: Path) -> PowerProbe:
    """Where this machine's draw can be read: its RAPL zones and discharging batteries, with a note
    for each source it lacks."""
    probe = PowerProbe()
    if platform.system() != "Linux" and root == Path("/"):
        probe.notes.append(f"not reported by this OS ({platform.system()}): no RAPL or battery power that a "
                           "user process can read")  # fmt: skip
        return probe
    probe.rapl, why = rapl_zones(root)
    if why:
        probe.notes.append(why)
    supplies = power_supplies(root)
    bats = [root / "sys" / "class" / "power_supply" / n for n, s in supplies.items() if s.get("type") == "Battery"]
    if not bats:
        probe.notes.append("no battery (/sys/class/power_supply has none)")
    for b in bats:
        if supplies[b.name].get("status") != "Discharging":
            probe.notes.append(f"battery {b.name} is {supplies[b.name].get('status', '?').lower()}, not "
                               "discharging: its power is not the machine's draw (unplug to measure it)")  # fmt: skip
        elif battery_watts(b) is None:
            probe.notes.append(f"battery {b.name} reports neither power_now nor current_now and voltage_now")
        else:
            probe.batteries.append(b)
    return probe


class EnergyCounter:
    """The machine's energy in joules since the counter was made, from what `probe` found: its
    RAPL zones (each wrap handled, so read at least once per wrap: minutes at a laptop's draw), else
    its batteries' power, integrated between reads (trapezoids; the firmware updates it every few
    seconds, so read it about once a second while it matters). `read()` is None while no source
    can be read (a battery that stopped discharging: the charger is in)."""

    def __init__(self, probe: PowerProbe, clock: Callable[[], float] = time.monotonic) -> None:
        self.probe = probe
        self.source = "rapl" if probe.rapl else "battery" if probe.batteries else ""
        self._clock = clock
        self._raw = {z.energy: _int(z.energy) for z in probe.rapl}
        self._joules = 0.0
        self._watts: float | None = None
        self._at = clock()

    def read(self) -> float | None:
        if self.source == "rapl":
            return self._rapl()
        if self.source == "battery":
            return self._battery()
        return None

    def _rapl(self) -> float | None:
        for z in self.probe.rapl:
            now, before = _int(z.energy), self._raw.get(z.energy)
            if now is None:
                return None
            if before is not None and now >= before:
                self._joules += (now - before) / 1e6
            elif before is not None and z.max_uj > 0:  # the counter wrapped
                self._joules += (now + z.max_uj - before) / 1e6
            self._raw[z.energy] = now
        return self._joules

    def _battery(self) -> float | None:
        now = self._clock()
        draining = [w for b in self.probe.batteries if discharging(b) and (w := battery_watts(b)) is not None]
        watts = sum(draining) if draining else None
        if watts is not None and self._watts is not None:
            self._joules += (watts + self._watts) / 2 * (now - self._at)
        self._watts, self._at = watts, now
        return self._joules if watts is not None else None
