"""A fake sysfs tree for the power readers (protocol/power.py reads under a root): RAPL zones and
power supplies, written as the kernel shows them."""

from __future__ import annotations

from pathlib import Path


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def rapl(root: Path, zone: str, name: str, uj: int, max_uj: int = 2**32) -> None:
    write(root, f"sys/class/powercap/{zone}/name", name + "\n")
    write(root, f"sys/class/powercap/{zone}/max_energy_range_uj", f"{max_uj}\n")
    set_uj(root, zone, uj)


def set_uj(root: Path, zone: str, uj: int) -> None:
    write(root, f"sys/class/powercap/{zone}/energy_uj", f"{uj}\n")


def supply(root: Path, name: str, **files: str) -> None:
    for key, value in files.items():
        write(root, f"sys/class/power_supply/{name}/{key}", value + "\n")
