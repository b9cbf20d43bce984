"""Whether this machine runs from its battery, as the OS says: read by the workers (the NPU's
performance mode and thread spinning, as each starts) and by `geniex doctor` alike."""

from __future__ import annotations

from pathlib import Path

import psutil

POWER_SUPPLIES = Path("/sys/class/power_supply")  # Linux's power_supply class


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
