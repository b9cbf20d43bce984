"""`geniex doctor`: the host's checks on fake trees, a probe that hangs, the unit's sandbox as
systemd-run is asked to make it, and the link from a worker's fallback reason to a check."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from gateway.doctor import host
from gateway.doctor.cli import differences
from gateway.doctor.report import hung, render, run_probe
from gateway.doctor.sandbox import SandboxError, check_can_enter, service_settings, systemd_run
from protocol import npu_plan, qnn
from protocol.doctor import CHECKS, Check, Report, fallback_check, verdicts
from workers.engines.llama_runtime import NO_GPU_OFFLOAD, NO_HTP

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# ---- a worker's fallback, to the check of its cause -----------------------------------------


@pytest.mark.parametrize(
    ("compute", "reason", "check"),
    [
        ("gpu", NO_GPU_OFFLOAD, "gpu.backends"),
        ("npu", NO_HTP, "npu.llama_htp"),
        ("npu", "the onnxruntime-qnn package is not installed", "npu.qnn_runtime"),
        ("npu", "onnxruntime-qnn is installed but reports no QNN device", "npu.qnn_runtime"),
        ("npu", "this x86_64 host has no NPU; Qualcomm's HTP simulator is for development only (...)", "npu.soc"),
        ("npu", "Genie bundles run only on a Snapdragon NPU, and this x86_64 host has no NPU; ...", "npu.soc"),
        ("npu", "QNN could not take the graph: Fail: QNN_COMMON_ERROR_MEM_ALLOC", "npu.htp_run"),
        ("hybrid", "QNN took no node of the graph ({})", "npu.htp_run"),
        ("npu", "architecture 'gemma3' has no NPU graph yet (supported: llama)", None),
        ("npu", "the model needs 9.45 GB of NPU memory (...), over the about 4.00 GB one process may use", None),
        ("npu", "", None),
    ],
)
def test_a_fallback_reason_names_the_doctor_check_of_its_cause(compute: str, reason: str, check: str | None) -> None:
    assert fallback_check(compute, reason) == check
    assert check is None or check in CHECKS


def test_the_simulator_rules_reason_is_matched_as_protocol_words_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(qnn.SIMULATOR_ENV, raising=False)
    reason = qnn.unavailable_reason()
    assert reason is not None and fallback_check("npu", reason) in ("npu.soc", "npu.qnn_runtime")


def test_a_unit_is_usable_only_with_no_failed_check_and_one_passed() -> None:
    got = verdicts([Check("cpu.run", "ok", "fine"), Check("gpu.backends", "fail", "no GPU backend"),
                    Check("gpu.drivers", "ok", "x"), Check("npu.soc", "skip", "not asked")])  # fmt: skip
    assert [(v.unit, v.usable, v.check) for v in got] == [("cpu", True, ""), ("gpu", False, "gpu.backends"),
                                                           ("npu", False, "")]  # fmt: skip


# ---- the host's NPU checks on fake trees ------------------------------------------------------


def test_a_snapdragon_is_named_from_its_device_tree(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"sys/firmware/devicetree/base/compatible": "lenovo,thinkpad-t14s\0qcom,x1e78100\0qcom,x1e80100\0",
                            "sys/firmware/devicetree/base/model": "Lenovo ThinkPad T14s Gen 6\0"})  # fmt: skip
    check, name = host.soc(root, {}, "aarch64")
    assert (check.status, name) == ("ok", "x-elite") and "ThinkPad T14s" in check.detail, check
    check, name = host.soc(tmp_path / "empty", {}, "aarch64")
    assert (check.status, name) == ("warn", None) and "GENIEX_QNN_SOC_MODEL" in check.fix
    check, _ = host.soc(tmp_path / "empty", {"PROCESSOR_IDENTIFIER": "Snapdragon(R) X Elite - X1E80100"}, "ARM64")
    assert check.status == "ok"
    check, _ = host.soc(tmp_path, {}, "x86_64")
    assert check.status in ("fail", "warn") and "no Qualcomm NPU" in check.detail


def test_the_fastrpc_group_says_who_must_join_it(tmp_path: Path) -> None:
    none = _tree(tmp_path / "a", {"etc/group": "root:x:0:\nvideo:x:44:ann\n"})
    assert host.fastrpc_group(none, [0], 1000).status == "warn"
    root = _tree(tmp_path / "b", {"etc/group": "root:x:0:\nfastrpc:x:977:ann\n"})
    assert host.fastrpc_group(root, [977, 1000], 1000).status == "ok"
    out = host.fastrpc_group(root, [1000], 1000)
    assert out.status == "fail" and "usermod -aG fastrpc" in out.fix and "SupplementaryGroups=fastrpc" in out.fix
    assert host.fastrpc_group(root, [0], 0).status == "warn"  # root opens anything: the service will not be root


def test_udev_rules_are_found_where_packages_and_admins_put_them(tmp_path: Path) -> None:
    assert host.udev_rules(tmp_path).status == "warn"
    root = _tree(tmp_path, {"usr/lib/udev/rules.d/60-fastrpc.rules":
                            'SUBSYSTEM=="fastrpc", KERNEL=="fastrpc-cdsp", GROUP="fastrpc", MODE="0660"\n',
                            "etc/udev/rules.d/99-other.rules": 'KERNEL=="ttyUSB0"\n'})  # fmt: skip
    out = host.udev_rules(root)
    assert (
        out.status == "ok" and "/usr/lib/udev/rules.d/60-fastrpc.rules" in out.detail and "99-other" not in out.detail
    )


def test_device_nodes_are_listed_with_their_mode_and_whether_they_open(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    out = host.fastrpc_nodes(_tree(tmp_path / "a", {"dev/fastrpc-adsp": ""}))
    assert out.status == "fail" and "only fastrpc-adsp" in out.detail and "npu.cdsp_firmware" in out.fix
    root = _tree(tmp_path / "b", {"dev/fastrpc-cdsp": "", "dev/dma_heap/system": "", "etc/group": "fastrpc:x:977:\n"})
    os.chmod(root / "dev/fastrpc-cdsp", 0o660)
    os.chown(root / "dev/fastrpc-cdsp", 0, 977) if os.geteuid() == 0 else None
    assert host.fastrpc_nodes(root).status == "ok" and host.dma_heap(root).status == "ok"
    monkeypatch.setattr(host.os, "access", lambda *_: False)  # as a user outside the group (tests may run as root)
    out = host.fastrpc_nodes(root)
    assert out.status == "fail" and "-rw-rw----" in out.detail and "not openable" in out.detail, out
    assert host.dma_heap(tmp_path / "c").status == "fail"


def test_skel_libraries_must_match_the_socs_htp(tmp_path: Path) -> None:
    skels = _tree(tmp_path, {"hexagon/libQnnHtpV73Skel.so": "", "hexagon/libQnnHtpV75Skel.so": ""})
    env = {"ADSP_LIBRARY_PATH": str(skels / "hexagon")}
    assert npu_plan.SOCS["x-elite"].htp_arch == "v73"
    assert host.skel_libs(env, "x-elite").status == "ok"
    out = host.skel_libs(env, "8-elite")
    assert out.status == "fail" and "V79" in out.detail, out
    assert host.skel_libs({"ADSP_LIBRARY_PATH": str(tmp_path / "nowhere")}, "x-elite").status == "fail"


def test_the_cdsp_must_be_running(tmp_path: Path) -> None:
    rp = "sys/class/remoteproc/remoteproc1"
    up = _tree(tmp_path / "a", {f"{rp}/name": "cdsp\n", f"{rp}/state": "running\n", f"{rp}/firmware": "qcom/x1e80100/cdsp.mbn\n",
                                "lib/firmware/qcom/x1e80100/LENOVO/21N1/qcdsp8380.mbn": ""})  # fmt: skip
    out = host.cdsp_firmware(up)
    assert out.status == "ok" and "qcdsp8380.mbn" in out.detail and "running" in out.detail, out
    down = _tree(tmp_path / "b", {f"{rp}/name": "cdsp\n", f"{rp}/state": "offline\n"})
    out = host.cdsp_firmware(down)
    assert out.status == "fail" and "fastrpc#377" in out.fix
    assert host.cdsp_firmware(tmp_path / "c").status == "fail"


def test_an_arm_laptop_gets_every_npu_check_and_x86_skips_the_devices(tmp_path: Path) -> None:
    checks, _ = host.npu_checks(tmp_path, {}, "aarch64")
    assert [c.name for c in checks] == [n for n in CHECKS if n.startswith("npu.") and n not in ("npu.htp_run",
                                                                                                "npu.llama_htp")]  # fmt: skip
    checks, _ = host.npu_checks(tmp_path, {}, "x86_64")
    assert all(c.status == "skip" for c in checks[2:])


# ---- probes ----------------------------------------------------------------------------------


def test_a_probe_that_hangs_is_killed_at_its_bound_and_reported(tmp_path: Path) -> None:
    t0 = time.monotonic()
    checks, why = run_probe([sys.executable, "-c", "import time; time.sleep(60)"], 1.0)
    assert checks is None and why == "did not return within 1 s" and time.monotonic() - t0 < 10
    out = hung("npu.htp_run", why)
    assert out.status == "fail" and "FastRPC" in out.detail and "did not return within 1 s" in out.detail
    checks, why = run_probe([sys.executable, "-c", "import sys; sys.exit('broken')"], 10)
    assert checks is None and "status 1: broken" in why
    checks, why = run_probe([sys.executable, "-c", "print('not json')"], 10)
    assert checks is None and "not a list of checks" in why
    good = '[{"name": "cpu.run", "status": "ok", "detail": "x"}]'
    assert run_probe([sys.executable, "-c", f"print('noise'); print({good!r})"], 10) == (
        [Check("cpu.run", "ok", "x")],
        "",
    )


def test_the_report_puts_the_fix_under_what_failed() -> None:
    checks = [
        Check("gpu.backends", "fail", "no GPU backend", "make install GPU=vulkan"),
        Check("cpu.run", "ok", "fine"),
    ]
    text = render(Report({"os": "x"}, verdicts(checks), checks))
    assert "GPU: not usable (gpu.backends): no GPU backend" in text and "fix: make install GPU=vulkan" in text
    assert "CPU: usable" in text


# ---- the unit's sandbox ------------------------------------------------------------------------


def test_the_services_sandbox_is_carried_to_systemd_run_and_its_start_is_not() -> None:
    settings = service_settings([REPO / "deploy/geniex.service", REPO / "deploy/geniex-npu.conf"])
    argv = systemd_run("geniex.service", settings, sys.executable, ["--compute", "npu"])
    props = [a.removeprefix("--property=") for a in argv if a.startswith("--property=")]
    assert "User=geniex" in props and "PrivateUsers=yes" in props and "ProtectHome=yes" in props
    # The drop-in's lines come after the unit's, as systemd applies them.
    assert props.index("PrivateDevices=yes") < props.index("PrivateDevices=no")
    assert "DeviceAllow=/dev/fastrpc-cdsp rw" in props and "SupplementaryGroups=fastrpc" in props
    assert "Environment=GENIEX_DATA_DIR=/var/lib/geniex" in props  # specifiers expanded as the service has them
    assert not [p for p in props if p.split("=")[0] in ("Type", "ExecStart", "WatchdogSec", "Restart")]
    i = argv.index("/opt/geniex/.venv/bin/geniex")  # the service's own install, not ours
    assert argv[i:] == ["/opt/geniex/.venv/bin/geniex", "doctor", "--compute", "npu", "--json",
                        "--in-sandbox=geniex.service"]  # fmt: skip


def test_without_systemd_the_sandbox_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="systemd is not the service manager here"):
        check_can_enter(tmp_path / "run/systemd/system")


def test_what_the_sandbox_changes_is_said() -> None:
    outside = Report({}, [], [Check("npu.fastrpc_nodes", "ok", "/dev/fastrpc-cdsp crw-rw----")])
    inside = Report(
        {}, [], [Check("npu.fastrpc_nodes", "fail", "no /dev/fastrpc-cdsp* node")], sandbox="geniex.service"
    )
    assert "npu.fastrpc_nodes: ok outside, fail inside" in differences(outside, inside)
    assert "came out as it did" in differences(inside, inside)


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "1e9", "soon"])
def test_a_probe_bound_out_of_range_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["doctor", "--timeout", value])
    assert done.value.code == 2 and "seconds from 1 to 3600" in capsys.readouterr().err
