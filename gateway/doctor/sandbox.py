"""`geniex doctor --unit`: the same checks from inside the systemd unit's sandbox.

The service does not run as the user who installed it, nor with their devices: deploy/geniex.service
gives it a private /dev, a private user namespace, no home, a read-only system. What the NPU needs
(its /dev/fastrpc-* nodes, the DMA heap, the `fastrpc` group) may be there for a login shell and
missing for the service. So the doctor reruns itself as a transient unit with the service's own
[Service] settings (its file and drop-ins, as systemd has them) and reports what differs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

# What makes a sandbox, not how a service starts, stops or restarts: everything else is carried.
NOT_CARRIED = frozenset({
    "Type", "NotifyAccess", "WatchdogSec", "ExecStart", "ExecStartPre", "ExecStartPost", "ExecReload",
    "ExecStop", "ExecStopPost", "ExecCondition", "Restart", "RestartSec", "RestartPreventExitStatus",
    "SuccessExitStatus", "TimeoutStartSec", "TimeoutStopSec", "TimeoutSec", "KillMode", "KillSignal",
    "RemainAfterExit", "PIDFile", "BusName", "FileDescriptorStoreMax", "Sockets",
})  # fmt: skip
# The specifiers of a system unit's settings (systemd.unit(5)); a transient unit's properties get
# none expanded, so they are expanded here as the service would have them.
SPECIFIERS = {"S": "/var/lib", "C": "/var/cache", "E": "/etc", "L": "/var/log", "t": "/run", "T": "/tmp",
              "V": "/var/tmp", "%": "%"}  # fmt: skip


class SandboxError(Exception):
    """Why the unit's sandbox cannot be entered here (said as it is, exit status 2)."""


def unit_files(service: str) -> list[Path]:
    """The unit's file, then its drop-ins, as the service manager has loaded them."""

    def show(prop: str) -> str:
        return subprocess.run(["systemctl", "show", "-P", prop, service], capture_output=True, text=True,
                              timeout=10, check=False).stdout.strip()  # fmt: skip

    fragment = show("FragmentPath")
    if not fragment:
        raise SandboxError(f"systemd has no unit {service} (install it: docs/operating.md#running-as-a-service)")
    return [Path(fragment), *(Path(p) for p in show("DropInPaths").split())]


def service_settings(files: list[Path]) -> list[tuple[str, str]]:
    """The [Service] assignments of the unit's files, in order (a drop-in's after the unit's: an empty
    assignment there resets a list, as systemd reads it), with continuation lines joined."""
    out: list[tuple[str, str]] = []
    for path in files:
        section = ""
        text = re.sub(r"\\\n", " ", path.read_text())
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "Service" and "=" in line:
                key, value = line.split("=", 1)
                out.append((key.strip(), value.strip()))
    return out


def expand(value: str) -> str:
    return re.sub(r"%(.)", lambda m: SPECIFIERS.get(m.group(1), m.group(0)), value)


def doctor_command(settings: list[tuple[str, str]], python: str) -> list[str]:
    """The doctor as the service would run it: the unit's own `geniex` (or its Python), else ours."""
    exec_start = next((v for k, v in reversed(settings) if k == "ExecStart" and v), "")
    program = shlex.split(exec_start.lstrip("-@:+!"))[0] if exec_start else ""
    if program.endswith("/geniex"):
        return [program, "doctor"]
    if re.search(r"/python[\d.]*$", program):
        return [program, "-m", "gateway.cli", "doctor"]
    return [python, "-m", "gateway.cli", "doctor"]


def systemd_run(service: str, settings: list[tuple[str, str]], python: str, doctor_args: list[str]) -> list[str]:
    props = [f"--property={k}={expand(v)}" for k, v in settings if k not in NOT_CARRIED]
    return ["systemd-run", "--quiet", "--wait", "--pipe", "--collect", "--service-type=exec",
            f"--unit=geniex-doctor-{os.getpid()}", *props,
            *doctor_command(settings, python), *doctor_args, "--json", f"--in-sandbox={service}"]  # fmt: skip


def check_can_enter(run_dir: Path = Path("/run/systemd/system")) -> None:
    if not run_dir.is_dir():
        raise SandboxError(f"systemd is not the service manager here (no {run_dir}): there is no unit sandbox to "
                           "enter; run `geniex doctor` without --unit")  # fmt: skip
    if os.geteuid() != 0:
        raise SandboxError("entering a system unit's sandbox needs root: sudo geniex doctor --unit")


def run_in_sandbox(service: str, python: str, doctor_args: list[str], timeout_s: float) -> str:
    """The doctor's JSON report from inside `service`'s sandbox (check_can_enter first)."""
    argv = systemd_run(service, service_settings(unit_files(service)), python, doctor_args)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"the doctor inside {service}'s sandbox did not finish within {timeout_s:g} s") from None
    if done.returncode not in (0, 1) or not done.stdout.strip():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SandboxError(f"the doctor could not run inside {service}'s sandbox (status {done.returncode}): {last}")
    return done.stdout.strip().splitlines()[-1]
