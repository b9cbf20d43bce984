"""deploy/: the systemd units pass `systemd-analyze verify` and stay hardened; the example
environment file names only settings that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import OTHER_ENV, env_name, serve_flags, serve_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SYSTEM_UNIT = DEPLOY / "geniex.service"
USER_UNIT = DEPLOY / "geniex-user.service"
NPU_DROP_IN = DEPLOY / "geniex-npu.conf"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (no systemd here)")


def installed_copy(unit: Path, dest: Path, drop_in: Path | None = None) -> Path:
    """The unit as installed, ExecStart pointing at this checkout's `geniex`: verify checks that
    the command exists, and /opt/geniex (or ~/.local/bin) is not where the tests run from. A
    `drop_in` goes beside it, in geniex.service.d/, where systemd-analyze reads it too."""
    geniex = Path(sys.executable).with_name("geniex")
    assert geniex.exists(), "the package's console script, installed by `make install`"
    text = re.sub(r"(?m)^ExecStart=\S+", f"ExecStart={geniex}", unit.read_text())
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / "geniex.service"  # the name it is installed under
    out.write_text(text)
    if drop_in is not None:
        (dest / "geniex.service.d").mkdir(exist_ok=True)
        (dest / "geniex.service.d" / "npu.conf").write_text(drop_in.read_text())
    return out


def analyze(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # A user manager's paths need XDG_RUNTIME_DIR, which a test runner may not have.
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_LEVEL": "notice"}
    assert ANALYZE
    return subprocess.run([ANALYZE, *args], capture_output=True, text=True, env=env, timeout=60, check=False)


@needs_analyze
@pytest.mark.parametrize(("unit", "scope"), [(SYSTEM_UNIT, "--system"), (USER_UNIT, "--user")])
def test_systemd_analyze_verify_is_clean(tmp_path: Path, unit: Path, scope: str) -> None:
    out = analyze(scope, "verify", str(installed_copy(unit, tmp_path / "unit")), tmp_path=tmp_path)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr


@needs_analyze
def test_the_system_unit_stays_hardened(tmp_path: Path) -> None:
    """Exposure 1.0 ("OK") with systemd 252, against 8.7 before the sandbox; --threshold counts in
    tenths (0..100) and leaves room for newer systemd versions that score more settings."""
    out = analyze("security", "--offline=yes", "--threshold=20", str(SYSTEM_UNIT), tmp_path=tmp_path)
    if "--offline" in out.stderr and "unrecognized" in out.stderr:
        pytest.skip("this systemd-analyze cannot score a unit file offline (systemd < 250)")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr


def _directives(path: Path) -> list[tuple[str, str]]:
    """A unit file's `Key=value` lines, in order (a key may repeat: DeviceAllow=)."""
    return re.findall(r"(?m)^([A-Za-z]+)=(.*)$", path.read_text())


def test_the_npu_drop_in_gives_back_the_fastrpc_nodes_and_their_group() -> None:
    """fastrpc 1.0.5's udev rules give its `fastrpc` group the /dev/fastrpc-* nodes: the allow-list
    alone lets the service see them, the group lets it open them."""
    directives = _directives(NPU_DROP_IN)
    assert ("SupplementaryGroups", "fastrpc") in directives
    assert ("PrivateDevices", "no") in directives and ("DevicePolicy", "closed") in directives
    assert ("DeviceAllow", "/dev/fastrpc-cdsp rw") in directives
    assert "\n[Service]\n" in NPU_DROP_IN.read_text()


@needs_analyze
def test_the_system_unit_with_the_npu_drop_in_verifies_and_stays_hardened(tmp_path: Path) -> None:
    unit = installed_copy(SYSTEM_UNIT, tmp_path / "unit", drop_in=NPU_DROP_IN)
    out = analyze("--system", "verify", str(unit), tmp_path=tmp_path)
    assert out.returncode == 0 and not (out.stdout + out.stderr).strip(), out.stdout + out.stderr
    out = analyze("security", "--offline=yes", "--threshold=20", str(unit), tmp_path=tmp_path)
    if "--offline" in out.stderr and "unrecognized" in out.stderr:
        pytest.skip("this systemd-analyze cannot score a unit file offline (systemd < 250)")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    assert "SupplementaryGroups=" in out.stdout  # the drop-in was read: its group is scored


def _settings(path: Path) -> dict[str, str]:
    """`VAR=value` lines, commented out or not (the example file comments them out)."""
    found = re.findall(r"(?m)^#?(GENIEX_[A-Z_]+)=(.*)$", path.read_text())
    return dict(found)


def _unit_environment(unit: Path) -> dict[str, str]:
    """`Environment=GENIEX_*` lines, commented out or not (the NPU drop-in comments its own out)."""
    return dict(re.findall(r"(?m)^#?Environment=(GENIEX_[A-Z_]+)=(.*)$", unit.read_text()))


def test_deploy_files_name_only_settings_that_exist() -> None:
    known = {env_name(a.option_strings[0]) for a in serve_flags(serve_parser())} | set(OTHER_ENV)
    named = set(_settings(DEPLOY / "geniex.env"))
    for unit in (SYSTEM_UNIT, USER_UNIT, NPU_DROP_IN):
        named |= set(_unit_environment(unit))
    assert named, "the example file names some settings"
    assert named <= known, f"unknown settings: {sorted(named - known)}"


def test_the_system_unit_keeps_its_data_where_systemd_made_room() -> None:
    env = _unit_environment(SYSTEM_UNIT)
    text = SYSTEM_UNIT.read_text()
    assert env["GENIEX_DATA_DIR"] == "%S/geniex" and "\nStateDirectory=geniex\n" in text
    assert "PYTHONPYCACHEPREFIX=%C/geniex/" in text and "\nCacheDirectory=geniex\n" in text
