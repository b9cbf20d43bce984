"""The doctor's checks of the host itself: files, device nodes, groups and versions, read without
loading an engine. Every path is read under `root` so that tests can hand in a fake tree.

What they look for is what the public record says breaks the NPU on Snapdragon laptops running
Linux: fastrpc 1.0.5 runs its daemons as a `fastrpc` user and group, with udev rules giving that
group /dev/fastrpc-*; QNN shares buffers with the DSP through a DMA-buf heap; the Hexagon skel
libraries must match the SoC's HTP version; and the cDSP must be up with firmware that matches
the board (qualcomm/fastrpc#377: a mismatched one times out at the first INIT_CREATE).
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import importlib.util
import os
import platform
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from protocol import npu_plan, qnn
from protocol.doctor import Check
from protocol.power import battery_state

FASTRPC_GROUP = "fastrpc"
DROP_IN = "deploy/geniex-npu.conf"


def _read(path: Path) -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _x86(machine: str) -> bool:
    return machine.lower() in ("x86_64", "amd64")


def soc(root: Path, environ: Mapping[str, str], machine: str) -> tuple[Check, str | None]:
    """npu.soc, and the SoC's npu_plan name when it is a known Snapdragon."""
    if _x86(machine):
        sim = " (Qualcomm's HTP simulator is on: development only)" if qnn.simulator_enabled() else ""
        return Check("npu.soc", "fail" if not sim else "warn", f"this {machine} host has no Qualcomm NPU{sim}",
                     "" if sim else f"none on this machine; for development, {qnn.SIMULATOR_ENV}=1"), None  # fmt: skip
    compatible = root / "sys/firmware/devicetree/base/compatible"
    found, how = npu_plan.detect_soc({}, compatible)
    if how.startswith("the device tree"):
        model = _read(root / "sys/firmware/devicetree/base/model")
        return Check("npu.soc", "ok", f"{found.title}: {how}{f' ({model})' if model else ''}"), found.name
    ident = environ.get("PROCESSOR_IDENTIFIER", "") or _read(root / "sys/devices/soc0/machine")
    if "snapdragon" in ident.lower() or "qualcomm" in ident.lower():
        return Check("npu.soc", "ok", f"{ident} (its limits: the {found.title}'s, assumed)"), found.name
    said = _read(compatible) or ident or "nothing"
    return Check("npu.soc", "warn", f"{machine} host whose SoC is not a known Snapdragon (the device tree says {said})",
                 "set GENIEX_QNN_SOC_MODEL to QNN's SoC model number if this is a Snapdragon"), None  # fmt: skip


def _wheel_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("onnxruntime_qnn")
    except (ImportError, ValueError):
        return None
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def qnn_runtime() -> Check:
    ort, plugin, wheel = _version("onnxruntime"), _version("onnxruntime-qnn"), _wheel_dir()
    if plugin is None or wheel is None:
        return Check("npu.qnn_runtime", "fail", f"onnxruntime-qnn is not installed (onnxruntime {ort or 'missing'})",
                     "make install (it installs onnxruntime-qnn on Linux aarch64, Windows ARM64 and x86_64)")  # fmt: skip
    # Read, not imported: the gateway never loads an engine's libraries.
    info = _read(wheel / "build_and_package_info.py")
    qairt = m.group(1) if (m := re.search(r"qnn_version\s*=\s*'([^']+)'", info)) else "unknown"
    return Check("npu.qnn_runtime", "ok", f"onnxruntime {ort}, onnxruntime-qnn {plugin}, QNN (QAIRT) {qairt}")


def _groups(root: Path) -> dict[str, tuple[int, list[str]]]:
    out = {}
    for line in _read(root / "etc/group").splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and parts[2].isdigit():
            out[parts[0]] = (int(parts[2]), [m for m in parts[3].split(",") if m])
    return out


def fastrpc_group(root: Path, gids: list[int], euid: int) -> Check:
    group = _groups(root).get(FASTRPC_GROUP)
    if group is None:
        return Check("npu.fastrpc_group", "warn", "there is no `fastrpc` group (fastrpc before 1.0.5, or a distribution "
                     "that names it otherwise): the nodes' own group below is the one that counts")  # fmt: skip
    gid, members = group
    if gid in gids:
        return Check("npu.fastrpc_group", "ok", f"group fastrpc (gid {gid}); this process is in it")
    if euid == 0:
        return Check("npu.fastrpc_group", "warn", f"group fastrpc (gid {gid}); this process runs as root, which opens "
                     "the nodes anyway: the service's user must be in the group (`geniex doctor --unit` checks)")  # fmt: skip
    return Check("npu.fastrpc_group", "fail", f"group fastrpc (gid {gid}) exists, but this process is not in it "
                 f"(members: {', '.join(members) or 'none'})",
                 f"sudo usermod -aG fastrpc $USER, then log in again; the service: SupplementaryGroups=fastrpc "
                 f"({DROP_IN})")  # fmt: skip


def udev_rules(root: Path) -> Check:
    found = []
    for folder in ("etc/udev/rules.d", "usr/lib/udev/rules.d", "lib/udev/rules.d"):
        for rules in sorted((root / folder).glob("*.rules")):
            if "fastrpc" in _read(rules):
                found.append(f"/{rules.relative_to(root)}")
    if found:
        return Check("npu.udev_rules", "ok", f"FastRPC rules in {', '.join(found)}")
    return Check("npu.udev_rules", "warn", "no udev rule names fastrpc: the nodes keep the kernel's root-only mode",
                 "install your distribution's fastrpc package (1.0.5 or later ships the rules), or add a rule giving "
                 "/dev/fastrpc-* to a group the service is in")  # fmt: skip


def _node_line(path: Path, root: Path) -> tuple[str, bool]:
    st = path.stat()
    names = {gid: name for name, (gid, _) in _groups(root).items()}
    ok = os.access(path, os.R_OK | os.W_OK)
    group = names.get(st.st_gid, str(st.st_gid))
    return f"/{path.relative_to(root)} {stat.filemode(st.st_mode)} uid {st.st_uid} group {group}" + (
        "" if ok else " (not openable by this process)"
    ), ok


def fastrpc_nodes(root: Path) -> Check:
    nodes = sorted((root / "dev").glob("fastrpc-*"))
    cdsp = [n for n in nodes if "cdsp" in n.name]
    if not cdsp:
        seen = f" (only {', '.join(n.name for n in nodes)})" if nodes else ""
        return Check("npu.fastrpc_nodes", "fail", f"no /dev/fastrpc-cdsp* node{seen}: the kernel's fastrpc driver has "
                     "not bound the cDSP", "check npu.cdsp_firmware below and `dmesg | grep -i -e fastrpc -e cdsp`; "
                     "the kernel needs CONFIG_QCOM_FASTRPC; under systemd, the drop-in " + DROP_IN)  # fmt: skip
    lines = [_node_line(n, root) for n in cdsp]
    detail = "; ".join(line for line, _ in lines)
    if any(ok for _, ok in lines):
        return Check("npu.fastrpc_nodes", "ok", detail)
    return Check("npu.fastrpc_nodes", "fail", detail, "join the nodes' group (npu.fastrpc_group above), or as a "
                 f"service, install {DROP_IN}")  # fmt: skip


def dma_heap(root: Path) -> Check:
    heaps = sorted((root / "dev/dma_heap").glob("*")) + ([root / "dev/ion"] if (root / "dev/ion").exists() else [])
    if not heaps:
        return Check("npu.dma_heap", "fail", "no /dev/dma_heap/* and no /dev/ion: QNN has no way to share buffers "
                     "with the DSP", "a kernel with CONFIG_DMABUF_HEAPS_SYSTEM; under systemd, " + DROP_IN)  # fmt: skip
    lines = [_node_line(h, root) for h in heaps]
    detail = "; ".join(line for line, _ in lines)
    if any(ok for _, ok in lines):
        return Check("npu.dma_heap", "ok", detail)
    return Check("npu.dma_heap", "fail", detail, "give the service's user access to /dev/dma_heap/system (a udev rule)")


def skel_libs(environ: Mapping[str, str], soc_name: str | None) -> Check:
    wheel = _wheel_dir()
    set_by = environ.get("ADSP_LIBRARY_PATH", "")
    dirs = [Path(d) for d in set_by.split(";" if ";" in set_by else ":") if d] if set_by else []
    if not dirs and wheel is not None:
        dirs = sorted({p.parent for p in wheel.rglob("libQnnHtpV*Skel.so")})
    skels = sorted({p.name for d in dirs for p in d.glob("libQnnHtpV*Skel.so")})
    where = (
        f"ADSP_LIBRARY_PATH={set_by}" if set_by else "the onnxruntime-qnn wheel (workers set ADSP_LIBRARY_PATH to it)"
    )
    if not skels:
        return Check("npu.skel_libs", "fail", f"no libQnnHtpV*Skel.so in {where}",
                     "the aarch64 onnxruntime-qnn wheel carries them; or point ADSP_LIBRARY_PATH at a QAIRT SDK's "
                     "lib/hexagon-v<N>/unsigned")  # fmt: skip
    # The skel library FastRPC loads is the one of the SoC's HTP version: libQnnHtpV<arch>Skel.so.
    want = npu_plan.SOCS[soc_name].htp_arch.removeprefix("v") if soc_name in npu_plan.SOCS else None
    if want is not None and f"libQnnHtpV{want}Skel.so" not in skels:
        return Check("npu.skel_libs", "fail", f"{where} has {', '.join(skels)}, not the V{want} this SoC runs",
                     f"point ADSP_LIBRARY_PATH at a folder with libQnnHtpV{want}Skel.so")  # fmt: skip
    return Check("npu.skel_libs", "ok", f"{', '.join(skels)} in {where}")


def cdsp_firmware(root: Path) -> Check:
    procs = []
    for rp in sorted((root / "sys/class/remoteproc").glob("remoteproc*")):
        name = _read(rp / "name")
        if "cdsp" in name.lower():
            procs.append(
                f"{rp.name} {name}: {_read(rp / 'state') or 'unknown'}, firmware {_read(rp / 'firmware') or '?'}"
            )
    files = sorted({f"/{p.relative_to(root)}" for base in ("lib/firmware", "usr/lib/firmware")
                    for pattern in ("*cdsp*.mbn", "*cdsp*.mdt") for p in (root / base).rglob(pattern)})  # fmt: skip
    shown = f"; firmware files: {', '.join(files[:4])}{' ...' if len(files) > 4 else ''}" if files else ""
    if any(p.endswith("running") or ": running," in p for p in procs):
        return Check("npu.cdsp_firmware", "ok", "; ".join(procs) + shown)
    if procs:
        return Check("npu.cdsp_firmware", "fail", "; ".join(procs) + shown,
                     "the cDSP is not running: `dmesg | grep -i cdsp`; firmware that matches no shell times out at "
                     "INIT_CREATE (qualcomm/fastrpc#377): install the firmware for this laptop model")  # fmt: skip
    return Check("npu.cdsp_firmware", "fail", f"no cDSP remote processor in /sys/class/remoteproc{shown or ''}",
                 "a kernel with the Qualcomm remoteproc (PAS) drivers and this laptop's cDSP firmware "
                 "(linux-firmware's qcom/ folder, or the vendor's)")  # fmt: skip


def npu_checks(root: Path, environ: Mapping[str, str], machine: str = platform.machine()) -> tuple[list[Check], bool]:
    """The host's NPU checks, and whether a QNN graph is worth trying here (an NPU, or the simulator)."""
    first, soc_name = soc(root, environ, machine)
    checks = [first, qnn_runtime()]
    if _x86(machine):
        why = "no NPU on this host"
        checks += [Check(n, "skip", why) for n in ("npu.fastrpc_group", "npu.udev_rules", "npu.fastrpc_nodes",
                                                  "npu.dma_heap", "npu.skel_libs", "npu.cdsp_firmware")]  # fmt: skip
        return checks, qnn.simulator_enabled() and checks[1].status == "ok"
    checks += [fastrpc_group(root, os.getgroups(), os.geteuid()), udev_rules(root), fastrpc_nodes(root), dma_heap(root),
               skel_libs(environ, soc_name), cdsp_firmware(root)]  # fmt: skip
    return checks, checks[1].status == "ok"


def gpu_drivers(root: Path) -> Check:
    render = sorted((root / "dev/dri").glob("renderD*"))
    icds = sorted(p.name for p in (root / "etc/OpenCL/vendors").glob("*.icd"))
    loader = ctypes.util.find_library("vulkan")
    parts = [f"Vulkan loader {loader or 'missing'}"]
    lines = [_node_line(r, root) for r in render]
    parts.append("render nodes: " + ("; ".join(line for line, _ in lines) if lines else "none"))
    parts.append(f"OpenCL drivers: {', '.join(icds) or 'none'}")
    detail = "; ".join(parts)
    if lines and not any(ok for _, ok in lines):
        return Check("gpu.drivers", "fail", detail, "sudo usermod -aG render $USER (and video), then log in again; "
                     "under systemd, see docs/operating.md#running-as-a-service")  # fmt: skip
    if not lines:
        return Check("gpu.drivers", "warn", detail + " (a GPU driver on the CPU, such as lavapipe, needs none)")
    return Check("gpu.drivers", "ok", detail)


def host_facts(root: Path) -> dict[str, str]:
    os_release = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', _read(root / "etc/os-release"), re.M))
    on_battery = battery_state(root / "sys/class/power_supply")
    return {
        "os": os_release.get("PRETTY_NAME") or platform.platform(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "power": {True: "battery", False: "mains"}.get(on_battery, "unknown")
        if on_battery is not None
        else "mains (no battery)",
    }
