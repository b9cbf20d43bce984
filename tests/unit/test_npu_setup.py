"""Where a Snapdragon's NPU is, the QNN plugin is installed: the project's own dependency markers,
evaluated for each platform (pip evaluates the same markers on the user's machine)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _installed_on(sys_platform: str, machine: str) -> set[str]:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    env = {"sys_platform": sys_platform, "platform_machine": machine, "platform_system": "", "python_version": "3.11"}
    return {r.name for r in map(Requirement, deps) if r.marker is None or r.marker.evaluate(env)}


@pytest.mark.parametrize(
    ("sys_platform", "machine"),
    [("linux", "aarch64"), ("win32", "ARM64"), ("linux", "x86_64")],  # the laptop on Linux, on Windows; the simulator
)
def test_the_qnn_plugin_is_installed_where_an_npu_or_its_simulator_is(sys_platform: str, machine: str) -> None:
    assert "onnxruntime-qnn" in _installed_on(sys_platform, machine)


@pytest.mark.parametrize(("sys_platform", "machine"), [("darwin", "arm64"), ("win32", "AMD64")])
def test_elsewhere_it_is_not_asked_for(sys_platform: str, machine: str) -> None:
    """No wheel is published there: asking for it would fail the install."""
    installed = _installed_on(sys_platform, machine)
    assert "onnxruntime-qnn" not in installed and "onnxruntime" in installed


def _supplies(tmp_path: Path, **online: str) -> Path:
    """A /sys/class/power_supply with a battery and, for each keyword, a mains supply and its `online`."""
    (tmp_path / "BAT0").mkdir(parents=True)
    (tmp_path / "BAT0" / "type").write_text("Battery\n")
    for name, value in online.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "type").write_text("Mains\n")
        (tmp_path / name / "online").write_text(value + "\n")
    return tmp_path


def _desktop(tmp_path: Path) -> Path:
    """A power_supply class with a mains supply and no battery (a desktop's, a mini PC's)."""
    (tmp_path / "AC").mkdir(parents=True)
    (tmp_path / "AC" / "type").write_text("Mains\n")
    (tmp_path / "AC" / "online").write_text("1\n")
    return tmp_path


def test_auto_performance_is_burst_plugged_in_and_balanced_on_battery(tmp_path: Path) -> None:
    from workers.engines.onnx import performance_mode

    assert performance_mode("auto", _supplies(tmp_path / "a", AC="1")) == "burst"
    assert performance_mode("auto", _supplies(tmp_path / "b", AC="0")) == "balanced"
    assert performance_mode("auto", _supplies(tmp_path / "c")) == "balanced"  # a battery and no mains supply
    assert performance_mode("auto", _desktop(tmp_path / "e")) == "burst"  # no battery at all: a desktop
    assert performance_mode("power_saver", _supplies(tmp_path / "d", AC="1")) == "power_saver"


def test_on_battery_reads_the_power_supply_class_and_where_there_is_none_asks_the_os(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    from workers.engines.onnx import on_battery

    assert on_battery(_supplies(tmp_path / "a", AC="0", ADP1="0"))
    assert not on_battery(_supplies(tmp_path / "b", AC="0", ADP1="1"))  # any mains supply online: plugged in
    assert not on_battery(_desktop(tmp_path / "c"))
    # No /sys/class/power_supply (Windows on Arm): psutil's reading; an OS that cannot tell counts as mains.
    for plugged, expected in [(False, True), (True, False), (None, False)]:
        battery = SimpleNamespace(percent=40.0, secsleft=3600, power_plugged=plugged)
        monkeypatch.setattr(psutil, "sensors_battery", lambda b=battery: b)
        assert on_battery(tmp_path / "none") is expected
    monkeypatch.setattr(psutil, "sensors_battery", lambda: None)  # no battery at all
    assert not on_battery(tmp_path / "none")


def test_npu_spinning_is_never_on_battery_unless_asked_for(tmp_path: Path) -> None:
    from workers.engines.onnx import spinning

    plugged, unplugged, desktop = _supplies(tmp_path / "a", AC="1"), _supplies(tmp_path / "b"), _desktop(tmp_path / "c")
    assert spinning("mains", plugged) and spinning("mains", desktop) and not spinning("mains", unplugged)
    assert not spinning("off", plugged) and not spinning("off", desktop)  # the default: whatever the power
    assert spinning("on", unplugged)  # asked for: even on battery


@pytest.mark.parametrize("spin", [False, True])
def test_npu_spinning_sets_both_of_onnxruntimes_pools(spin: bool) -> None:
    from workers.engines.npu.decoder import session_options

    so = session_options({"seq": 1, "past": 16}, 2, spin)
    value = "1" if spin else "0"
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == value
    assert so.get_session_config_entry("session.inter_op.allow_spinning") == value
    default = session_options({"seq": 1, "past": 16}, 2)  # the CPU sessions' and the tests': never spinning
    assert default.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert default.get_session_config_entry("session.inter_op.allow_spinning") == "0"


def test_the_resolved_spinning_is_logged_once_as_the_worker_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import structlog

    from workers.engines import onnx

    monkeypatch.setattr(onnx, "on_battery", lambda _path=onnx.POWER_SUPPLIES: True)
    with structlog.testing.capture_logs() as logs:
        assert onnx.spinning_at_start("mains") is False
    assert [(e["event"], e["setting"], e["spinning"]) for e in logs] == [("npu thread spinning", "mains", False)]


@pytest.mark.parametrize("simulated", [True, False])
def test_every_htp_option_is_explicit(monkeypatch: pytest.MonkeyPatch, simulated: bool) -> None:
    from protocol import qnn
    from workers.engines import onnx

    monkeypatch.setattr(qnn, "is_simulated", lambda: simulated)
    monkeypatch.delenv("GENIEX_QNN_SOC_MODEL", raising=False)
    options = onnx.qnn_options("sustained_high_performance")
    assert options["backend_type"] == "htp" and options["enable_htp_fp16_precision"] == "1"
    assert options["htp_performance_mode"] == "sustained_high_performance"
    # The simulator needs a SoC to model and keeps the default finalization (its compile time is a
    # test's); the device detects its SoC and compiles each graph once, most optimized.
    assert options.get("soc_model") == ("60" if simulated else None)
    assert options.get("htp_graph_finalization_optimization_mode") == (None if simulated else "3")


def test_the_performance_setting_reaches_the_worker() -> None:
    from gateway import cli

    args = cli.serve_parser().parse_args(["--npu-performance", "power_saver"])
    assert cli.settings_from(args).npu_performance == "power_saver"
    with pytest.raises(SystemExit):
        cli.serve_parser().parse_args(["--npu-performance", "turbo"])


def test_the_spinning_setting_reaches_the_worker() -> None:
    from gateway import cli
    from protocol import worker_args

    assert cli.settings_from(cli.serve_parser().parse_args([])).npu_spinning == "off"  # the default
    settings = cli.settings_from(cli.serve_parser().parse_args(["--npu-spinning", "mains"]))
    assert settings.npu_spinning == "mains"
    with pytest.raises(SystemExit):
        cli.serve_parser().parse_args(["--npu-spinning", "always"])
    args = worker_args.WorkerArgs(engine="onnx", model_path="m", npu_spinning=settings.npu_spinning)
    assert worker_args.parse(worker_args.argv(args)).npu_spinning == "mains"
