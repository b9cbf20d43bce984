"""Whether this host has a QNN NPU to offer: the rule the gateway (choosing a compute unit) and
every QNN engine (ONNX, OCR, NPU chat) follow alike.

On a Snapdragon (Windows on Arm, Linux on Arm) the HTP backend is the Hexagon NPU. On x86_64 the
HTP backend is Qualcomm's simulator: correct but seconds per step, so it is for development and
tests only, used when GENIEX_QNN_SIMULATOR=1 (`geniex serve --qnn-simulator`) and otherwise not at
all (`compute: npu` falls back to the CPU with a warning).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform

SIMULATOR_ENV = "GENIEX_QNN_SIMULATOR"
# `--npu-performance`: onnxruntime's QNN `htp_performance_mode` values, and `auto`, which a worker
# resolves when it starts: `balanced` on battery, else `burst`.
PERFORMANCE_MODES = ("auto", "burst", "sustained_high_performance", "high_performance", "balanced",
                     "low_balanced", "high_power_saver", "power_saver", "low_power_saver", "extreme_power_saver")  # fmt: skip


def is_simulated() -> bool:
    """This host's HTP backend is the simulator (no NPU here)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def simulator_enabled() -> bool:
    return os.environ.get(SIMULATOR_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def _installed() -> bool:
    """Without importing it (the gateway never loads an engine): is the QNN plugin there?"""
    try:
        return importlib.util.find_spec("onnxruntime_qnn") is not None
    except (ImportError, ValueError):
        return False


def unavailable_reason() -> str | None:
    """Why `compute: npu` cannot use QNN here, or None when it may (the engine still checks that
    QNN takes the model)."""
    if not _installed():
        return "the onnxruntime-qnn package is not installed"
    if is_simulated() and not simulator_enabled():
        return (
            f"this {platform.machine()} host has no NPU; Qualcomm's HTP simulator is for development only "
            f"(enable it with {SIMULATOR_ENV}=1 or `geniex serve --qnn-simulator`)"
        )
    return None
