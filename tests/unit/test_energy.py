"""Energy per answer (gateway/ops/energy.py) on a fake sysfs tree (protocol/power.py reads under a
root): RAPL's counters with their wrap, psys over the packages, a discharging battery's power
integrated, and the machine's energy split equally among the requests running."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.ops.energy import EnergyMeter
from protocol.power import EnergyCounter, find_power
from tests.sysfs_tree import rapl as _rapl
from tests.sysfs_tree import set_uj
from tests.sysfs_tree import write as _write


def test_rapl_counts_each_joule_once_across_a_wrap(tmp_path: Path) -> None:
    _rapl(tmp_path, "intel-rapl:0", "package-0", 9_000_000, max_uj=10_000_000)
    _rapl(tmp_path, "intel-rapl:0:0", "core", 5)  # inside the package: never added again
    counter = EnergyCounter(find_power(tmp_path))
    assert counter.source == "rapl" and counter.read() == 0.0
    set_uj(tmp_path, "intel-rapl:0", 9_500_000)
    assert counter.read() == 0.5
    set_uj(tmp_path, "intel-rapl:0", 1_000_000)  # wrapped at 10 J
    assert counter.read() == pytest.approx(2.0)


def test_psys_alone_where_the_platform_zone_exists(tmp_path: Path) -> None:
    """psys holds the packages: adding both would count the CPU's joules twice."""
    _rapl(tmp_path, "intel-rapl:0", "package-0", 0)
    _rapl(tmp_path, "intel-rapl:1", "psys", 0)
    probe = find_power(tmp_path)
    assert [z.name for z in probe.rapl] == ["psys"]
    counter = EnergyCounter(probe)
    set_uj(tmp_path, "intel-rapl:0", 3_000_000)
    set_uj(tmp_path, "intel-rapl:1", 5_000_000)
    assert counter.read() == 5.0


def test_a_discharging_battery_is_integrated_and_unknown_on_the_charger(tmp_path: Path) -> None:
    bat = "sys/class/power_supply/BAT0"
    _write(tmp_path, f"{bat}/type", "Battery\n")
    _write(tmp_path, f"{bat}/status", "Discharging\n")
    _write(tmp_path, f"{bat}/power_now", "10000000\n")  # 10 W
    now = [0.0]
    counter = EnergyCounter(find_power(tmp_path), clock=lambda: now[0])
    assert counter.source == "battery"
    assert counter.read() == 0.0  # the first reading starts the integral
    now[0] = 2.0
    _write(tmp_path, f"{bat}/power_now", "20000000\n")
    assert counter.read() == pytest.approx(30.0)  # 2 s between 10 W and 20 W
    _write(tmp_path, f"{bat}/status", "Charging\n")
    now[0] = 3.0
    assert counter.read() is None


def test_the_machines_energy_is_split_equally_among_running_requests(tmp_path: Path) -> None:
    _rapl(tmp_path, "intel-rapl:0", "package-0", 0)
    meter = EnergyMeter(EnergyCounter(find_power(tmp_path)))
    set_uj(tmp_path, "intel-rapl:0", 4_000_000)  # 4 J while nothing ran: nobody's
    a = meter.begin()
    set_uj(tmp_path, "intel-rapl:0", 6_000_000)  # 2 J, a alone
    b = meter.begin()
    set_uj(tmp_path, "intel-rapl:0", 10_000_000)  # 4 J, a and b: 2 J each
    assert a is not None and b is not None
    assert a.end() == 4.0
    set_uj(tmp_path, "intel-rapl:0", 11_000_000)  # 1 J, b alone
    assert b.end() == 3.0 and b.end() == 3.0  # the same figure once ended
    set_uj(tmp_path, "intel-rapl:0", 20_000_000)
    meter.sample()
    assert a.end() == 4.0 and b.end() == 3.0


def test_a_request_through_an_unreadable_interval_has_no_figure(tmp_path: Path) -> None:
    _rapl(tmp_path, "intel-rapl:0", "package-0", 0)
    meter = EnergyMeter(EnergyCounter(find_power(tmp_path)))
    share = meter.begin()
    (tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj").unlink()
    meter.sample()
    assert share is not None and share.end() is None


def test_no_counter_no_meter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENIEX_SYSFS_ROOT", str(tmp_path))
    meter = EnergyMeter.for_this_machine()
    assert not meter.enabled and meter.begin() is None
