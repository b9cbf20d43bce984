"""Field benchmark: what this machine does with GenieX, in one JSON and one Markdown report to attach to an issue.

    .venv/bin/python bench/field.py [--model NAME_OR_PATH] [--units cpu,gpu,npu] [--rounds N] [--out DIR]
                                    [--llama-server PATH] [--npu-simulator]

For each compute unit the machine has (cpu; gpu where a GPU build of llama.cpp sees a device, the
Vulkan venv `.venv/vulkan` included; npu where QNN is available) and each model (the bundled
SmolLM2-135M, plus every --model: a GGUF path or a name in the model store), through our real
server (`geniex serve`, one per Python build) and the `openai` SDK, streamed and greedy:

- prefill tok/s: a prompt of a few hundred tokens, prompt tokens / TTFT (TTFT includes the first
  sampled token and the HTTP round trip, so this slightly under-states the engine's own rate);
- decode tok/s and TTFT at 1 client: bench.py's story prompt, (tokens - 1) / (last - first token);
- aggregate tok/s of --clients (4) clients started together: all tokens / (first send -> last token);
- power over each of those windows where the OS reports it: Linux RAPL (the CPU package, every
  process on it included) and a discharging battery's power_now (or current_now x voltage_now).

Targets take turns in each round (the order reverses every other round), medians over --rounds.
With `llama-server` on PATH (or --llama-server) the same workload runs against it on the same GGUF
(`-ngl 0`, beside our cpu rows) and the report gives the ratios. Software paths (Vulkan on Mesa's
lavapipe, Qualcomm's HTP simulator) run a light workload and only the bundled model, unless
--software-all-models: they measure that the path works, not a GPU's or an NPU's speed. Whatever is
not measured is named, with the reason, under `skipped`. Nothing here asserts a speed.

Writes field-<host>-<date>.json and .md into --out (default: the current directory).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import glob
import importlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx
import openai
import psutil

from bench.gpu import VULKAN_PYTHON
from bench.launcher import end
from bench.stats import med, summary
from protocol import qnn
from protocol.power import EnergyCounter, PowerProbe, battery_watts, find_power, power_supplies
from tests.server_proc import ServerProcess, free_port

# bench.bench and bench.kv_types are not type-clean (`make check` runs mypy on gateway, workers and
# protocol only) and a plain import would make `mypy bench/field.py` check them too; imported by
# name, their helpers are Any here.
_bench: Any = importlib.import_module("bench.bench")
_kv: Any = importlib.import_module("bench.kv_types")

UNITS = ("cpu", "gpu", "npu")
LAVAPIPE_GLOB = "/usr/share/vulkan/icd.d/lvp_icd.*.json"
# Run in another build's python: the ggml devices it sees and its llama-cpp-python, by the worker's own code.
DEVICE_PROBE = (
    "import json, importlib.metadata as m; from workers.engines.llama_runtime import devices, backend_names; "
    "print(json.dumps({'devices': [[d.name, d.kind, d.description] for d in devices()], "
    "'backends': backend_names(), 'llama_cpp_python': m.version('llama-cpp-python')}))"
)
VERSIONED = ("llama-cpp-python", "onnxruntime", "onnxruntime-qnn", "openai", "gguf")
log = _bench.log


# ---- what is measured, and on what -------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    prompt_words: int  # the prefill prompt's size (bench/kv_types.py's diary prompt)
    max_tokens: int  # tokens generated per decode request and per client
    clients: int  # concurrent clients (1: no concurrency window)
    nctx: int | None = None  # a request's `nctx` (the QNN simulator compiles for a small one)
    label: str = "full"


@dataclass
class Build:
    """One `geniex serve`: a Python (a venv with its llama.cpp build) and its environment."""

    name: str
    python: str
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()


@dataclass
class Target:
    """One row of a model's table: a compute unit on one of our servers, or llama-server."""

    name: str
    unit: str
    build: str | None  # our Build's name; None for llama-server
    workload: Workload
    software: bool = False  # lavapipe or the simulator: the path, not the hardware
    note: str = ""


@dataclass
class Model:
    label: str
    id: str  # the name our servers know it by
    gguf: str  # the file (for llama-server and the report)
    bundled: bool = False


@dataclass
class Plan:
    builds: dict[str, Build] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    probes: dict[str, Any] = field(default_factory=dict)

    def skip(self, what: str, why: str) -> None:
        log(f"skipped: {what}: {why}")
        self.skipped.append({"what": what, "why": why})


# ---- power: RAPL and the battery, read from sysfs (root is a parameter so tests can fake it) ---------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip().strip("\x00")
    except OSError:
        return None


def power_source(root: Path) -> str:
    """`mains`, `battery` or why it is not known, from sysfs (Linux) or psutil (Windows, macOS)."""
    supplies = power_supplies(root)
    if supplies:
        if any(s.get("type") != "Battery" and s.get("online") == "1" for s in supplies.values()):
            return "mains"
        batteries = [s for s in supplies.values() if s.get("type") == "Battery"]
        if batteries and any(s.get("status") == "Discharging" for s in batteries):
            return "battery"
        if batteries:
            return "mains"  # a battery charging or full, no supply marked online (some firmwares)
    try:
        bat = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError):
        bat = None
    if bat is not None:
        return "mains" if bat.power_plugged else "battery"
    return "unknown (no power supply reported: a desktop or a VM)"


class PowerMeter:
    """Joules and mean watts over one window: RAPL counters read at both ends (protocol/power.py's
    EnergyCounter: one wrap handled),
    the battery sampled every `interval` s by a thread (its reading is an average the firmware
    updates every few seconds, so short windows see a stale figure)."""

    def __init__(self, probe: PowerProbe, interval: float = 0.25) -> None:
        self.probe = probe
        self.interval = interval
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.result: dict[str, Any] = {}

    def _sample(self) -> None:
        while True:
            watts = [w for b in self.probe.batteries if (w := battery_watts(b)) is not None]
            if watts:
                self.samples.append(sum(watts))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PowerMeter:
        self._rapl = EnergyCounter(PowerProbe(rapl=self.probe.rapl)) if self.probe.rapl else None
        if self.probe.batteries:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        seconds = time.perf_counter() - self._t0
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        out: dict[str, Any] = {"seconds": round(seconds, 3)}
        if self._rapl is not None:
            joules = self._rapl.read() or 0.0
            out["rapl_j"] = round(joules, 3)
            out["rapl_w"] = round(joules / seconds, 2) if seconds > 0 else None
        if self.samples:
            watts = sum(self.samples) / len(self.samples)
            out["battery_w"] = round(watts, 2)
            out["battery_j"] = round(watts * seconds, 3)
        self.result = out


def power_summary(windows: list[dict[str, Any]], tokens: list[int]) -> dict[str, Any]:
    """One phase's windows over the rounds: mean watts (all joules / all seconds) and joules per token."""
    seconds = sum(w.get("seconds", 0.0) for w in windows)
    out: dict[str, Any] = {}
    for src in ("rapl", "battery"):
        js = [w[f"{src}_j"] for w in windows if f"{src}_j" in w]
        if not js or seconds <= 0:
            continue
        out[f"{src}_w"] = round(sum(js) / seconds, 2)
        n = sum(tokens)
        out[f"{src}_j_per_token"] = round(sum(js) / n, 4) if n else None
    return out


# ---- the machine, the versions -------------------------------------------------------------------


def os_name(root: Path) -> str:
    for line in (_read(root / "etc" / "os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return f"{platform.system()} {platform.release()}".strip()


def cpu_model(root: Path) -> str:
    """/proc/cpuinfo's model name (x86) or Hardware (some Arm kernels), the device tree's model, else platform's."""
    info = _read(root / "proc" / "cpuinfo") or ""
    for key in ("model name", "Hardware", "Processor"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", info, re.MULTILINE)
        if m:
            return m.group(1).strip()
    return _read(root / "proc" / "device-tree" / "model") or platform.processor() or platform.machine()


def soc(root: Path) -> str | None:
    """The SoC from the device tree's compatible list or /sys/devices/soc0 (Arm boards, Snapdragon laptops)."""
    parts = []
    compatible = _read(root / "proc" / "device-tree" / "compatible")
    if compatible:
        parts.append(", ".join(s for s in compatible.split("\x00") if s))
    soc0 = root / "sys" / "devices" / "soc0"
    fields = {k: v for k in ("family", "machine", "soc_id") if (v := _read(soc0 / k))}
    if fields:
        parts.append(" ".join(f"{k} {v}" for k, v in fields.items()))
    return "; ".join(parts) or None


def machine_facts(root: Path = Path("/")) -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "os": os_name(root),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpu": cpu_model(root),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_logical": psutil.cpu_count(logical=True),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "soc": soc(root),
        "power_source": power_source(root),
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"geniex": _bench.git_rev()}
    for name in ("geniex-server", *VERSIONED):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# ---- which units this machine has --------------------------------------------------------------------


def probe_build(python: str, env: dict[str, str]) -> dict[str, Any]:
    """The ggml devices and backends a build sees, by the worker's own function, in its own python."""
    try:
        done = subprocess.run([python, "-c", DEVICE_PROBE], cwd=REPO, env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc), "devices": [], "backends": []}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr or done.stdout)[-400:], "devices": [], "backends": []}
    return dict(json.loads(lines[-1]))


def gpu_device(probe: dict[str, Any]) -> list[str] | None:
    return next((d for d in probe["devices"] if d[1] in ("gpu", "igpu")), None)


def is_software(description: str) -> bool:
    return any(s in description.lower() for s in ("llvmpipe", "lavapipe", "swiftshader"))


def plan_gpu(plan: Plan, args: argparse.Namespace, main: dict[str, Any]) -> None:
    """gpu on this venv's build if it sees a GPU, else on the Vulkan venv's: a hardware device as the
    loader finds it, else (llama.cpp skips CPU-type devices unless GGML_VK_VISIBLE_DEVICES names them)
    Mesa's lavapipe, with the light workload."""
    build, dev = None, gpu_device(main)
    if dev is not None:
        build = Build("main", sys.executable)
    elif VULKAN_PYTHON.exists():
        vk = plan.probes["vulkan"] = probe_build(str(VULKAN_PYTHON), {})
        dev = gpu_device(vk)
        env: dict[str, str] = {}
        icd = sorted(glob.glob(LAVAPIPE_GLOB))
        if dev is None and icd and not args.no_lavapipe:
            env = {"GGML_VK_VISIBLE_DEVICES": "0", "VK_ICD_FILENAMES": icd[0]}
            vk = plan.probes["vulkan"] = probe_build(str(VULKAN_PYTHON), env)
            dev = gpu_device(vk)
        if dev is None:
            why = "no lavapipe ICD" if not icd else "--no-lavapipe" if args.no_lavapipe else vk.get("error", "")
            plan.skip("gpu", f"the Vulkan build (.venv/vulkan) sees no GPU device ({why}); its devices: "
                             f"{', '.join(d[0] for d in vk['devices']) or 'none'}")  # fmt: skip
            return
        build = Build("vulkan", str(VULKAN_PYTHON), env)
    else:
        plan.skip("gpu", f"no GPU build of llama.cpp: this venv's registers {', '.join(main['backends']) or '?'} "
                         "and sees no GPU, and .venv/vulkan is absent (`make llama-vulkan` builds one)")  # fmt: skip
        return
    plan.builds.setdefault(build.name, build)
    software = is_software(dev[2])
    wl = light_workload(args) if software else full_workload(args)
    note = f"{dev[0]} {dev[2]}" + ("; software Vulkan on the CPU, the path and not a GPU" if software else "")
    plan.targets.append(Target("gpu", "gpu", build.name, wl, software=software, note=note))


def plan_npu(plan: Plan, args: argparse.Namespace, main: dict[str, Any]) -> None:
    """npu on llama.cpp's Hexagon device when the build has one, else QNN (protocol/qnn.py's rule); on
    x86_64 QNN is Qualcomm's simulator, seconds per step: only with --npu-simulator, and tiny."""
    if any(d[0].upper().startswith("HTP") for d in main["devices"]):
        plan.targets.append(Target("npu", "npu", "main", full_workload(args), note="llama.cpp Hexagon (HTP)"))
        return
    if qnn.is_simulated() and not args.npu_simulator:
        plan.skip("npu", f"this {platform.machine()} host has no NPU; Qualcomm's HTP simulator takes seconds per "
                         "step: pass --npu-simulator to include it (a tiny workload)")  # fmt: skip
        return
    if args.npu_simulator:
        os.environ[qnn.SIMULATOR_ENV] = "1"  # for unavailable_reason() here; the server gets --qnn-simulator
    why = qnn.unavailable_reason()
    if why:
        plan.skip("npu", why)
        return
    sim = qnn.is_simulated()
    if sim:
        main_build = plan.builds["main"]
        main_build.args = (*main_build.args, "--qnn-simulator")
    wl = Workload(16, 3, 1, nctx=128, label="simulator") if sim else full_workload(args)
    note = "QNN HTP simulator on the CPU, the path and not an NPU" if sim else "QNN HTP"
    plan.targets.append(Target("npu", "npu", "main", wl, software=sim, note=note))
    if sim:
        plan.skip("npu, 4 clients", "the simulator runs one sequence at a time, seconds per step")


def full_workload(args: argparse.Namespace) -> Workload:
    return Workload(args.prompt_words, args.max_tokens, args.clients)


def light_workload(args: argparse.Namespace) -> Workload:
    return Workload(args.light_prompt_words, args.light_max_tokens, args.clients, label="light")


def make_plan(args: argparse.Namespace) -> Plan:
    plan = Plan()
    plan.builds["main"] = Build("main", sys.executable)
    main = plan.probes["main"] = probe_build(sys.executable, {})
    for unit in args.units:
        if unit == "cpu":
            plan.targets.append(Target("cpu", "cpu", "main", full_workload(args)))
        elif unit == "gpu":
            plan_gpu(plan, args, main)
        elif unit == "npu":
            plan_npu(plan, args, main)
    for unit in UNITS:
        if unit not in args.units:
            plan.skip(unit, "not in --units")
    return plan


# ---- models -----------------------------------------------------------------------------------------------


def resolve_models(args: argparse.Namespace, plan: Plan) -> list[Model]:
    """The bundled model, and each --model: a GGUF path, or a name in --data-dir's store (not downloaded
    here: `geniex pull NAME` first)."""
    bundled = _bench.model_path(_bench.DEFAULT_MODEL, args.data_dir)
    models = [Model("SmolLM2-135M-Instruct Q4_1 (bundled)", _bench.DEFAULT_MODEL, bundled, bundled=True)]
    for name in args.model:
        path = Path(name).expanduser()
        if path.is_file():
            stem = re.sub(r"[^A-Za-z0-9._-]", "-", path.stem).strip(".-") or "model"
            models.append(Model(path.name, f"field/{stem}", str(path.resolve())))
            continue
        try:
            from gateway.models.store import ModelStore

            entry = ModelStore(args.data_dir).resolve(name)
        except Exception as exc:  # ModelNotFound, a bad name: say so and go on with the others
            plan.skip(f"model {name}", f"not a file, and not in {args.data_dir}: {exc}")
            continue
        if entry.id == _bench.DEFAULT_MODEL:
            continue  # the bundled model is always there
        if not entry.path.endswith(".gguf"):
            plan.skip(f"model {name}", f"{entry.engine} model, not a GGUF: this benchmark runs chat GGUFs")
            continue
        models.append(Model(name, entry.id, entry.path))
    if not args.model:
        plan.skip("a 1B-class model", "none given (--model PATH.gguf or a name in the store)")
    return models


def import_models(models: list[Model], data_dir: Path) -> list[str]:
    """`geniex pull --local` each non-bundled model into a server's scratch data dir; the errors."""
    errors = []
    for m in models:
        if m.bundled:
            continue
        done = subprocess.run([sys.executable, "-m", "gateway.cli", "pull", m.id, "--local", m.gguf, "--data-dir",
                               str(data_dir)], cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            errors.append(f"{m.label}: geniex pull --local failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return errors


# ---- servers ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def our_server(build: Build, data_dir: Path, args: argparse.Namespace) -> Iterator[ServerProcess]:
    srv = ServerProcess(data_dir, "--nctx", str(args.nctx), "--load-timeout-s", "1800", "--keep-alive-s", "-1",
                        *build.args, *args.server_arg, env=build.env, python=build.python)  # fmt: skip
    try:
        srv.wait_ready(timeout=120)
        yield srv
    finally:
        srv.stop()


def llama_server_exe(args: argparse.Namespace) -> str | None:
    return args.llama_server or shutil.which("llama-server")


@contextlib.contextmanager
def llama_server(exe: str, gguf: str, args: argparse.Namespace, log_dir: Path) -> Iterator[str]:
    """llama-server on the GGUF, laid out as our CPU worker is: 4 slots of --nctx, physical-core threads,
    nothing offloaded (`-ngl 0`: it sits beside our cpu rows). Yields its base URL."""
    port = free_port()
    threads = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    cmd = [exe, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-np", str(args.clients), "-c",
           str(args.nctx * args.clients), "-t", str(threads), "-ngl", "0", *args.llama_server_arg]  # fmt: skip
    logf = open(log_dir / f"llama-server-{port}.log", "wb")
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, preexec_fn=_bench._die_with_us)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # /health: 503 while the model loads, 200 when it serves
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}: {_read(Path(logf.name)) or ''}"[-800:])
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise TimeoutError("llama-server not healthy in 600 s")
        yield base
    finally:
        end(proc, 30)
        logf.close()


def llama_server_version(exe: str) -> str | None:
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if "version" in ln.lower()]
    return lines[0].strip() if lines else None


def worker_facts(base_url: str, model: Model, unit: str) -> dict[str, Any] | None:
    """What our server says of the worker that served (model, unit): the unit really used, why not the
    one asked for, the devices its build sees, its CPU features."""
    try:
        rows = httpx.get(f"{base_url}/v1/workers", timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    keys = ("model", "compute", "runs_on", "fallback", "engine", "provider", "devices", "cpu_features",
            "offloaded_layers", "n_layers", "parallel", "nctx", "rss_bytes", "kv_bytes_per_token")  # fmt: skip
    for w in rows:
        if w["model"].split(":")[0] == model.id.split(":")[0] and w["compute"] == unit:
            return {k: w.get(k) for k in keys}
    return None


def llama_server_props(base_url: str) -> dict[str, Any] | None:
    try:
        props = httpx.get(f"{base_url}/props", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None
    return {k: props.get(k) for k in ("build_info", "total_slots", "model_path") if k in props}


# ---- one round of one target --------------------------------------------------------------------------


def long_prompt(words: int) -> list[dict[str, str]]:
    # A system turn keeps SmolLM2's template from adding its own long default system prompt.
    return [{"role": "system", "content": "You are a diarist."}, {"role": "user", "content": _kv.prompt(words)}]


async def windowed(power: PowerProbe, fn: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    with PowerMeter(power) as meter:
        res = dict(await fn())
    res["power"] = meter.result
    return res


async def one_round(client: openai.AsyncOpenAI, model_id: str, t: Target, extra: dict[str, Any],
                    power: PowerProbe) -> dict[str, Any]:  # fmt: skip
    """Prefill (long prompt, TTFT), decode at 1 client, then `clients` at once, each a power window."""
    wl = t.workload
    cpu = _bench.ForeignCPU()
    pre = await windowed(power, lambda: _bench.stream_once(client, model_id, 2, long_prompt(wl.prompt_words), extra))
    ttft = pre.get("ttft_ms")
    pre["prefill_tps"] = pre["prompt_tokens"] / (ttft / 1000) if ttft and pre.get("prompt_tokens") else None
    dec = await windowed(power, lambda: _bench.stream_once(client, model_id, wl.max_tokens, _bench.MESSAGES, extra))
    out: dict[str, Any] = {"prefill": pre, "decode": dec}
    if wl.clients > 1:
        out["concurrent"] = await windowed(
            power, lambda: _bench.concurrent(client, model_id, wl.max_tokens, wl.clients, extra)
        )
    wall = sum(x["power"]["seconds"] for x in out.values())
    out["foreign_cpu_share"] = round(cpu.take() / (max(wall, 1e-3) * (os.cpu_count() or 1)), 3)
    return out


def extra_body(t: Target) -> dict[str, Any]:
    # Every round repeats its prompts: no server may reuse one (llama-server reads the same field).
    body: dict[str, Any] = {"cache_prompt": False}
    if t.build is not None:
        body["compute"] = t.unit
    if t.workload.nctx:
        body["nctx"] = t.workload.nctx
    return body


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds, the spread of each, power per phase; the rounds themselves, trimmed."""
    pre = [r["prefill"] for r in rounds]
    dec = [r["decode"] for r in rounds]
    conc = [r["concurrent"] for r in rounds if "concurrent" in r]
    out: dict[str, Any] = {
        "prompt_tokens": med([x.get("prompt_tokens") for x in pre]),
        "prefill_tps": summary([x["prefill_tps"] for x in pre]),
        "ttft_ms": summary([x["ttft_ms"] for x in dec]),
        "decode_tps": summary([x["decode_tps"] for x in dec]),
        "tokens": med([x["tokens"] for x in dec]),
        "power": {
            "prefill": power_summary([x["power"] for x in pre], [x.get("prompt_tokens") or 0 for x in pre]),
            "decode": power_summary([x["power"] for x in dec], [x["tokens"] for x in dec]),
        },
        "foreign_cpu_share_max": max((r["foreign_cpu_share"] for r in rounds), default=None),
        "text": dec[0].get("text") if dec else None,
    }
    if conc:
        out["clients"] = conc[0]["n"]
        out["aggregate_tps"] = summary([x["aggregate_tps"] for x in conc])
        out["per_stream_tps"] = med([x["per_stream_tps"] for x in conc])
        out["concurrent_ttft_ms"] = med([x["ttft_ms_median"] for x in conc])
        out["power"]["concurrent"] = power_summary([x["power"] for x in conc], [x["tokens"] for x in conc])
    out["rounds"] = [{k: (_bench.public(v) if isinstance(v, dict) else v) for k, v in r.items()} for r in rounds]
    return out


# ---- one model: every target, rounds alternating ---------------------------------------------------------


async def warm(client: openai.AsyncOpenAI, model_id: str, t: Target) -> float:
    """A first short request: loads the worker (the NPU's: converts and compiles); its seconds."""
    t0 = time.perf_counter()
    await _bench.stream_once(client, model_id, 2, extra_body=extra_body(t))
    return time.perf_counter() - t0


async def bench_model(model: Model, targets: list[Target], urls: dict[str, str], args: argparse.Namespace,
                      plan: Plan, power: PowerProbe, guard: Any) -> dict[str, Any]:  # fmt: skip
    """Warm every target, then rounds with the targets taking turns (the order reversed every other
    round, so slow drift hits all alike); `guard` (bench.py's) runs a round again, once, after the
    machine is idle, when other processes used more than 5 % of the CPU during it."""
    kw: dict[str, Any] = {"api_key": "unused", "max_retries": 0, "timeout": 3600}
    clients = {t.name: openai.AsyncOpenAI(base_url=f"{urls[t.name]}/v1", **kw) for t in targets}
    out: dict[str, Any] = {"label": model.label, "id": model.id, "gguf": model.gguf, "targets": {}}
    live = []
    for t in targets:
        try:
            load_s = await warm(clients[t.name], model.id, t)
        except Exception as exc:  # a unit that cannot serve this model: named, not fatal
            plan.skip(f"{t.name} x {model.label}", f"first request failed: {type(exc).__name__}: {exc}"[:400])
            continue
        facts = worker_facts(urls[t.name], model, t.unit) if t.build else llama_server_props(urls[t.name])
        if t.build and facts and facts.get("runs_on") != t.unit:  # measured, it would be the CPU under another name
            plan.skip(
                f"{t.name} x {model.label}", f"the worker runs on {facts.get('runs_on')}: {facts.get('fallback')}"
            )
            continue
        out["targets"][t.name] = {"unit": t.unit, "ours": t.build is not None, "note": t.note, "software": t.software,
                                  "workload": dataclasses.asdict(t.workload),
                                  "first_request_s": round(load_s, 2), "server": facts}  # fmt: skip
        live.append(t)
        log(f"{model.label}: {t.name} ready ({load_s:.1f} s to the first answer)")
    per: dict[str, list[dict[str, Any]]] = {t.name: [] for t in live}
    for r in range(args.rounds):
        for t in live if r % 2 == 0 else list(reversed(live)):
            try:
                label = f"{model.label} round {r + 1} {t.name}"
                res = await guard.run(label, lambda t=t: one_round(clients[t.name], model.id, t, extra_body(t), power))
            except Exception as exc:
                out["targets"][t.name].setdefault("errors", []).append(
                    f"round {r + 1}: {type(exc).__name__}: {exc}"[:400]
                )
                continue
            per[t.name].append(res)
            log(f"{model.label} round {r + 1}/{args.rounds} {t.name}: prefill {res['prefill']['prefill_tps'] or 0:.1f}, "
                f"decode {res['decode']['decode_tps'] or 0:.1f}"
                + (f", {t.workload.clients} clients {res['concurrent']['aggregate_tps']:.1f}" if "concurrent" in res else "")
                + " tok/s")  # fmt: skip
    for t in live:
        if per[t.name]:
            out["targets"][t.name].update(summarize(per[t.name]))
        if t.build:  # after the rounds: rss, and the same facts (a worker may have been restarted)
            out["targets"][t.name]["server"] = (
                worker_facts(urls[t.name], model, t.unit) or out["targets"][t.name]["server"]
            )
    for c in clients.values():
        await c.close()
    out["ratios"] = ratios(out["targets"])
    return out


def _median(target: dict[str, Any] | None, key: str) -> float | None:
    if not target or not isinstance(target.get(key), dict):
        return None
    value = target[key].get("median")
    return float(value) if value is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def ratios(targets: dict[str, Any]) -> dict[str, Any]:
    """Each other unit against cpu, and our cpu against llama-server: ratios of medians (TTFT: a difference)."""
    out: dict[str, Any] = {}
    cpu = targets.get("cpu")
    pairs = [(f"{n}/cpu", targets[n], cpu) for n in targets if n not in ("cpu", "llama-server")]
    pairs.append(("cpu/llama-server", cpu, targets.get("llama-server")))
    for name, a, b in pairs:
        if not a or not b or "decode_tps" not in a or "decode_tps" not in b:
            continue
        same_workload = a["workload"] == b["workload"]
        row: dict[str, Any] = {k: _ratio(_median(a, k), _median(b, k)) for k in ("prefill_tps", "decode_tps")}
        if same_workload:
            row["aggregate_tps"] = _ratio(_median(a, "aggregate_tps"), _median(b, "aggregate_tps"))
            ta, tb = _median(a, "ttft_ms"), _median(b, "ttft_ms")
            row["ttft_ms_diff"] = round(ta - tb, 1) if ta is not None and tb is not None else None
            row["same_greedy_text"] = a.get("text") == b.get("text")
        else:
            row["note"] = "different workloads: prefill and decode rates only"
        out[name] = row
    return out


# ---- the reports ---------------------------------------------------------------------------------------


_f = _bench.fmt  # "-" for a missing figure, floats to `nd` places


def _rate(x: float | None) -> str:
    # Software paths run at a fraction of a token per second: keep two figures there.
    return _f(x, 2 if x is not None and x < 10 else 1)


def _power_cell(p: dict[str, Any]) -> str:
    parts = [f"{p[f'{s}_w']:.1f} W ({s}), {p.get(f'{s}_j_per_token') or 0:.3f} J/tok" for s in ("rapl", "battery")
             if f"{s}_w" in p]  # fmt: skip
    return "; ".join(parts) or "-"


def runs_on(t: dict[str, Any]) -> str:
    s = t.get("server") or {}
    if not t.get("ours"):
        return "llama-server" + (f" {s['build_info']}" if s.get("build_info") else "") + ", `-ngl 0`"
    where = str(s.get("runs_on", "?"))
    if t.get("note"):
        where += f": {t['note']}"
    return where


def model_table(m: dict[str, Any], with_power: bool) -> list[str]:
    head = ["target", "runs on", "prompt / gen tokens", "prefill tok/s", "decode tok/s", "TTFT ms (1 client)",
            "N clients tok/s"]  # fmt: skip
    if with_power:
        head.append("power, decode")
    lines = [f"### {m['label']}", "", f"`{m['id']}`, {Path(m['gguf']).name}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    for name, t in m["targets"].items():
        if "decode_tps" not in t:
            lines.append(f"| {name} | {runs_on(t)} | no round completed: {'; '.join(t.get('errors', []))[:200]} |")
            continue
        agg = t.get("aggregate_tps")
        cells = [name, runs_on(t), f"{_f(t.get('prompt_tokens'), 0)} / {_f(t.get('tokens'), 0)}",
                 _rate(_median(t, "prefill_tps")), _rate(_median(t, "decode_tps")), _f(_median(t, "ttft_ms"), 0),
                 f"{_rate(_median(t, 'aggregate_tps'))} ({t['clients']})" if agg else "-"]  # fmt: skip
        if with_power:
            cells.append(_power_cell(t["power"]["decode"]))
        lines.append("| " + " | ".join(cells) + " |")
    for name, r in m.get("ratios", {}).items():
        bits = [f"prefill {_f(r.get('prefill_tps'), 3)}×", f"decode {_f(r.get('decode_tps'), 3)}×"]
        if "aggregate_tps" in r:
            bits.append(f"N clients {_f(r.get('aggregate_tps'), 3)}×")
            bits.append(f"TTFT {r['ttft_ms_diff']:+.1f} ms" if r.get("ttft_ms_diff") is not None else "TTFT -")
            bits.append(f"same greedy text: {r.get('same_greedy_text')}")
        if "note" in r:
            bits.append(r["note"])
        lines.append(f"\n{name}: " + ", ".join(bits))
    noisy = [f"{n} {t['foreign_cpu_share_max']:.0%}" for n, t in m["targets"].items()
             if (t.get("foreign_cpu_share_max") or 0) > 0.1]  # fmt: skip
    if noisy:
        lines.append(f"\nNoise: other processes' largest share of the CPU during a round: {', '.join(noisy)}.")
    return lines


def workers_block(m: dict[str, Any]) -> list[str]:
    lines = ["", "<details><summary>what the server reported (/v1/workers, llama-server /props)</summary>", "",
             "```json"]  # fmt: skip
    facts = {
        n: {**(t.get("server") or {}), "first_request_s": t.get("first_request_s")} for n, t in m["targets"].items()
    }
    lines += [json.dumps(facts, indent=1), "```", "", "</details>"]
    return lines


def power_line(power: dict[str, Any]) -> str:
    if not power.get("sources"):
        return "not reported by this OS: " + "; ".join(power["notes"])
    return ", ".join(power["sources"]) + (f" (also: {'; '.join(power['notes'])})" if power["notes"] else "")


def render_markdown(report: dict[str, Any]) -> str:
    mc, v, meta = report["machine"], report["versions"], report["meta"]
    power = report["power"]
    with_power = bool(power.get("sources"))
    lines = [
        f"## GenieX field benchmark: {mc['host']}, {meta['started']}",
        "",
        f"- **Machine**: {mc['os']}, kernel {mc['kernel']} ({mc['arch']}); {mc['cpu']}, {mc['cores_physical']} "
        f"cores / {mc['cores_logical']} threads; {mc['ram_gib']} GiB RAM"
        + (f"; SoC: {mc['soc']}" if mc.get("soc") else "") + f"; power: {mc['power_source']}",
        f"- **Versions**: geniex {v.get('geniex')}, llama-cpp-python {v.get('llama-cpp-python')}"
        + (f" (Vulkan venv {v['llama-cpp-python (vulkan)']})" if v.get("llama-cpp-python (vulkan)") else "")
        + f", onnxruntime {v.get('onnxruntime')}, onnxruntime-qnn {v.get('onnxruntime-qnn')}"
        + (f", llama-server {v['llama-server']}" if v.get("llama-server") else "") + f", Python {mc['python']}",
        f"- **Power**: {power_line(power)}",
        f"- **Workload**: greedy, streamed, `cache_prompt: false`; prefill = prompt tokens / TTFT of a "
        f"{meta['prompt_words']}-word prompt; decode and TTFT on bench.py's story prompt, {meta['max_tokens']} "
        f"tokens; {meta['clients']} clients at once; {meta['rounds']} rounds, targets alternating, medians. "
        "Software paths (lavapipe, the QNN simulator) run a lighter workload (their token counts are in the table).",
    ]  # fmt: skip
    if meta.get("rounds_redone") or meta.get("rounds_contended"):
        lines.append(f"- **Noise**: {meta.get('rounds_redone', 0)} round(s) run again after other processes used the "
                     f"CPU during them; still disturbed: {', '.join(meta.get('rounds_contended') or []) or 'none'}")  # fmt: skip
    lines.append("")
    for m in report["models"]:
        lines += model_table(m, with_power)
        lines += workers_block(m)
        lines.append("")
    lines.append("### Skipped")
    lines.append("")
    lines += [f"- {s['what']}: {s['why']}" for s in report["skipped"]] or ["- nothing"]
    if report.get("errors"):
        lines += ["", "### Errors", ""] + [f"- {e}" for e in report["errors"]]
    lines += ["", f"_bench/field.py, {meta['elapsed_s']} s; the JSON beside this file has every round._", ""]
    return "\n".join(lines)


# ---- the run -----------------------------------------------------------------------------------------------


def targets_for(model: Model, plan: Plan, args: argparse.Namespace, have_llama_server: bool) -> list[Target]:
    """This model's targets: software paths take only the bundled model unless asked; llama-server
    sits beside our cpu rows."""
    out = []
    for t in plan.targets:
        if t.software and not model.bundled and not args.software_all_models:
            path = "Mesa's lavapipe" if t.unit == "gpu" else "the QNN simulator"
            plan.skip(f"{t.name} x {model.label}", f"{t.name} here is {path}, a software path (minutes per round on "
                      "a larger model): pass --software-all-models to include it")  # fmt: skip
            continue
        out.append(t)
    if have_llama_server and any(t.name == "cpu" for t in out):
        out.append(Target("llama-server", "cpu", None, full_workload(args)))
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    waited = await asyncio.to_thread(_bench.wait_until_idle, args.wait_idle) if args.wait_idle > 0 else 0.0
    plan = make_plan(args)
    power = find_power(Path("/"))
    for note in power.notes:
        plan.skip("power", note)
    report: dict[str, Any] = {
        "meta": {"started": time.strftime("%Y-%m-%d %H:%M %z"), "rounds": args.rounds, "max_tokens": args.max_tokens,
                 "prompt_words": args.prompt_words, "clients": args.clients, "nctx": args.nctx,
                 "units": args.units, "waited_for_idle_s": round(waited, 1), "argv": sys.argv[1:]},
        "machine": machine_facts(),
        "versions": package_versions(),
        "power": {"sources": [f"RAPL {z.name}" for z in power.rapl] + [f"battery {b.name}" for b in power.batteries],
                  "notes": power.notes},
        "probes": plan.probes,
        "models": [],
        "errors": [],
    }  # fmt: skip
    if "vulkan" in plan.probes:
        report["versions"]["llama-cpp-python (vulkan)"] = plan.probes["vulkan"].get("llama_cpp_python")
    exe = llama_server_exe(args)
    if exe:
        report["versions"]["llama-server"] = llama_server_version(exe)
    else:
        plan.skip("llama-server", "no llama-server on PATH (give --llama-server PATH)")
    models = resolve_models(args, plan)
    guard = _bench.Guard(args.wait_idle, retries=1, precheck=False)
    used = {t.build for t in plan.targets if t.build}
    with tempfile.TemporaryDirectory(prefix="geniex-field-") as tmp, contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        for name in sorted(used):
            data = Path(tmp) / name
            data.mkdir()
            report["errors"] += import_models(models, data)
            srv = stack.enter_context(our_server(plan.builds[name], data, args))
            urls[name] = srv.base_url
            log(f"server {name} ({plan.builds[name].python}) ready at {srv.base_url}")
        for model in models:
            targets = targets_for(model, plan, args, exe is not None)
            by_target = {t.name: urls[t.build] for t in targets if t.build}
            with contextlib.ExitStack() as per_model:
                if exe and any(t.name == "llama-server" for t in targets):
                    try:
                        by_target["llama-server"] = per_model.enter_context(
                            llama_server(exe, model.gguf, args, Path(tmp))
                        )
                    except Exception as exc:
                        plan.skip(f"llama-server x {model.label}", f"did not start: {exc}"[:400])
                        targets = [t for t in targets if t.name != "llama-server"]
                report["models"].append(await bench_model(model, targets, by_target, args, plan, power, guard))
    report["meta"]["rounds_redone"] = guard.redone
    report["meta"]["rounds_contended"] = guard.contended
    report["skipped"] = plan.skipped
    report["meta"]["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    report["machine"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return report


def write_reports(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    host = re.sub(r"[^A-Za-z0-9._-]", "-", report["machine"]["host"]) or "host"
    stem = out / f"field-{host}-{time.strftime('%Y-%m-%d-%H%M')}"
    js, md = stem.with_suffix(".json"), stem.with_suffix(".md")
    js.write_text(json.dumps(report, indent=2, default=str))
    md.write_text(render_markdown(report))
    return js, md


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from gateway.ops.settings import default_data_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], help="also this model: a GGUF path, or a name in "
                   "--data-dir's store, e.g. a 1B-class GGUF (repeatable)")  # fmt: skip
    p.add_argument("--units", default="cpu,gpu,npu", help="comma-separated, of cpu, gpu, npu (default all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path.cwd(), help="where the reports go (default: the current directory)")
    p.add_argument("--llama-server", default=None, help="llama-server to compare with (default: the one on PATH)")
    p.add_argument("--llama-server-arg", action="append", default=[], help="extra llama-server argument (repeatable)")
    p.add_argument("--npu-simulator", action="store_true", help="on x86_64: run npu on QNN's HTP simulator (slow)")
    p.add_argument("--no-lavapipe", action="store_true", help="no gpu on Mesa's lavapipe when no hardware GPU is seen")
    p.add_argument("--software-all-models", action="store_true",
                   help="run --model on lavapipe and the simulator too (default: the bundled model only)")  # fmt: skip
    p.add_argument("--prompt-words", type=int, default=240, help="the prefill prompt (240 words: about 330 tokens)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per decode request and per client")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--light-prompt-words", type=int, default=32, help="the prefill prompt on a software GPU")
    p.add_argument("--light-max-tokens", type=int, default=8, help="tokens per request on a software GPU")
    p.add_argument("--nctx", type=int, default=2048, help="our servers' --nctx; llama-server gets clients x this")
    p.add_argument("--data-dir", type=Path, default=None, help="the store --model names are looked up in "
                   "(default: $GENIEX_DATA_DIR, $GENIEX_DATADIR or ~/.cache/geniex); nothing is written to it")  # fmt: skip
    p.add_argument("--server-arg", action="append", default=[], help="extra `geniex serve` argument (repeatable)")
    p.add_argument("--wait-idle", type=float, default=60.0,
                   help="wait up to this many seconds for other processes to stop using CPU first (0: not)")  # fmt: skip
    a = p.parse_args(argv)
    a.units = [u.strip() for u in a.units.split(",") if u.strip()]
    if bad := [u for u in a.units if u not in UNITS]:
        p.error(f"unknown unit(s) {bad}: cpu, gpu, npu")
    a.data_dir = a.data_dir or default_data_dir()
    return a


def _terminate(signum: int, _frame: object) -> None:
    # SystemExit unwinds the run: asyncio cancels it and the servers' context managers stop them.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    report = asyncio.run(run(args))
    js, md = write_reports(report, args.out)
    print(md.read_text())
    print(f"reports: {js}\n         {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
