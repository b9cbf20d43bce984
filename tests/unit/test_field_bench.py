"""bench/field.py's pure parts: power read from a fake sysfs tree, the machine facts, the ratios and
the Markdown report of a result dict. No server, no model; speed is never asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import field
from tests.sysfs_tree import rapl as _rapl
from tests.sysfs_tree import supply as _supply
from tests.sysfs_tree import write as _write


def test_rapl_packages_only_and_a_discharging_battery(tmp_path: Path) -> None:
    _rapl(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    _rapl(tmp_path, "intel-rapl:0:0", "core", 5)  # inside package-0: not counted again
    _rapl(tmp_path, "intel-rapl-mmio:0", "package-0", 7)  # the same package through MMIO
    _supply(tmp_path, "AC", type="Mains", online="0")
    _supply(tmp_path, "BAT0", type="Battery", status="Discharging", power_now="12500000")
    probe = field.find_power(tmp_path)
    assert [z.name for z in probe.rapl] == ["package-0"]
    assert [b.name for b in probe.batteries] == ["BAT0"] and probe.readable and probe.notes == []
    assert field.power_source(tmp_path) == "battery"

    with field.PowerMeter(probe, interval=0.01) as meter:
        _write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", "3500000\n")
    got = meter.result
    assert got["rapl_j"] == 2.5 and got["battery_w"] == 12.5
    assert got["rapl_w"] is not None and got["rapl_w"] > 0 and "battery_j" in got


def test_a_wrapped_rapl_counter(tmp_path: Path) -> None:
    _rapl(tmp_path, "intel-rapl:0", "package-0", 9_000_000, max_uj=10_000_000)
    probe = field.find_power(tmp_path)
    with field.PowerMeter(probe) as meter:
        _write(tmp_path, "sys/class/powercap/intel-rapl:0/energy_uj", "500000\n")
    assert meter.result["rapl_j"] == 1.5


def test_what_is_not_readable_is_said(tmp_path: Path) -> None:
    # energy_uj as a folder: reading it fails as a root-only file does for a user (this runs as anyone).
    (tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj").mkdir(parents=True)
    _supply(tmp_path, "AC", type="Mains", online="1")
    _supply(tmp_path, "BAT0", type="Battery", status="Charging", current_now="1000000", voltage_now="12000000")
    probe = field.find_power(tmp_path)
    assert not probe.readable
    assert "unreadable" in probe.notes[0] and "root" in probe.notes[0]
    assert "charging" in probe.notes[1]
    assert field.power_source(tmp_path) == "mains"
    assert field.battery_watts(tmp_path / "sys/class/power_supply/BAT0") == 12.0


def test_no_power_reported(tmp_path: Path) -> None:
    probe = field.find_power(tmp_path)
    assert not probe.readable and len(probe.notes) == 2
    assert "no RAPL" in probe.notes[0] and "no battery" in probe.notes[1]


def test_soc_and_cpu_from_the_device_tree(tmp_path: Path) -> None:
    _write(tmp_path, "proc/device-tree/compatible", "qcom,x1e80100-crd\x00qcom,x1e80100\x00")
    _write(tmp_path, "proc/device-tree/model", "Qualcomm CRD\x00")
    _write(tmp_path, "sys/devices/soc0/family", "Snapdragon\n")
    _write(tmp_path, "sys/devices/soc0/soc_id", "555\n")
    _write(tmp_path, "proc/cpuinfo", "processor\t: 0\nBogoMIPS\t: 38.40\n")
    assert field.soc(tmp_path) == "qcom,x1e80100-crd, qcom,x1e80100; family Snapdragon soc_id 555"
    assert field.cpu_model(tmp_path) == "Qualcomm CRD"
    _write(tmp_path, "proc/cpuinfo", "processor\t: 0\nmodel name\t: AMD EPYC\n")
    assert field.cpu_model(tmp_path) == "AMD EPYC"


def _target(prefill: float, decode: float, ttft: float, agg: float | None, **kw: Any) -> dict[str, Any]:
    t: dict[str, Any] = {
        "unit": "cpu", "ours": True, "note": "", "workload": {"prompt_words": 240, "max_tokens": 64, "clients": 4},
        "prompt_tokens": 342, "tokens": 64, "prefill_tps": {"median": prefill}, "decode_tps": {"median": decode},
        "ttft_ms": {"median": ttft}, "text": "Once upon a time", "foreign_cpu_share_max": 0.0,
        "power": {"decode": {}}, "server": {"runs_on": "cpu", "fallback": None}, "first_request_s": 1.5,
    }  # fmt: skip
    if agg is not None:
        t.update(aggregate_tps={"median": agg}, clients=4)
    t.update(kw)
    return t


def test_ratios_and_the_markdown_report() -> None:
    light = {"prompt_words": 32, "max_tokens": 8, "clients": 4}
    gpu = {"unit": "gpu", "workload": light, "note": "Vulkan0 llvmpipe; software", "server": {"runs_on": "gpu"}}
    targets = {
        "cpu": _target(250.0, 80.0, 150.0, 110.0),
        "gpu": _target(8.0, 2.0, 3900.0, 1.0, **gpu),
        "llama-server": _target(260.0, 84.0, 140.0, 120.0, ours=False, server={"build_info": "b7000"}),
    }
    rt = field.ratios(targets)
    assert rt["gpu/cpu"] == {"prefill_tps": 0.032, "decode_tps": 0.025,
                             "note": "different workloads: prefill and decode rates only"}  # fmt: skip
    assert rt["cpu/llama-server"]["decode_tps"] == 0.952 and rt["cpu/llama-server"]["ttft_ms_diff"] == 10.0
    assert rt["cpu/llama-server"]["same_greedy_text"] is True

    report = {
        "meta": {"started": "2026-01-01 10:00 +0000", "rounds": 3, "max_tokens": 64, "prompt_words": 240,
                 "clients": 4, "elapsed_s": 99.0},
        "machine": {"host": "box", "os": "Debian 12", "kernel": "6.1", "arch": "x86_64", "cpu": "AMD EPYC",
                    "cores_physical": 2, "cores_logical": 2, "ram_gib": 23.5, "soc": None,
                    "power_source": "mains", "python": "3.11.7"},
        "versions": {"geniex": "abc123", "llama-cpp-python": "0.3.36", "onnxruntime": "1.32.0",
                     "onnxruntime-qnn": "2.7.0"},
        "power": {"sources": [], "notes": ["no RAPL counters", "no battery"]},
        "models": [{"label": "SmolLM2 (bundled)", "id": "org/m:Q4_1", "gguf": "/x/m.gguf", "targets": targets,
                    "ratios": rt}],
        "skipped": [{"what": "npu", "why": "no NPU"}],
    }  # fmt: skip
    md = field.render_markdown(report)
    assert "## GenieX field benchmark: box, 2026-01-01 10:00 +0000" in md
    assert "AMD EPYC, 2 cores / 2 threads; 23.5 GiB RAM; power: mains" in md
    assert "**Power**: not reported by this OS: no RAPL counters; no battery" in md
    assert "| cpu | cpu | 342 / 64 | 250.0 | 80.0 | 150 | 110.0 (4) |" in md
    assert "| llama-server | llama-server b7000, `-ngl 0` |" in md
    assert "cpu/llama-server: prefill 0.962×, decode 0.952×, N clients 0.917×, TTFT +10.0 ms" in md
    assert "- npu: no NPU" in md and "power, decode" not in md  # no power column when none is readable
