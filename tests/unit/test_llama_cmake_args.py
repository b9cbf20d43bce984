"""deploy/llama-cmake-args.sh: the llama.cpp backends each machine shape builds, probed on a fake
machine's files (GENIEX_SYSROOT, GENIEX_MACHINE, GENIEX_CPUINFO) and a glslc there or not (GLSLC)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "llama-cmake-args.sh"
X86_FLAGS = "flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 amx_tile\n"


def machine(root: Path, *, arch: str = "x86_64", vulkan: int | None = None, loader: bool = True,
            opencl: bool = False) -> dict[str, str]:  # fmt: skip
    """A machine's files under `root`: Vulkan headers of version `vulkan` (None: none), the loader,
    OpenCL headers with an ICD; returns the environment that makes the script probe them."""
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(X86_FLAGS if arch == "x86_64" else "Features\t: fp asimd\n")
    if vulkan is not None:
        (root / "usr/include/vulkan").mkdir(parents=True)
        (root / "usr/include/vulkan/vulkan_core.h").write_text(f"#define VK_HEADER_VERSION {vulkan}\n")
    if loader:
        (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
        (root / "usr/lib/x86_64-linux-gnu/libvulkan.so.1").write_bytes(b"")
    if opencl:
        (root / "usr/include/CL").mkdir(parents=True)
        (root / "usr/include/CL/cl.h").write_text("")
        (root / "etc/OpenCL/vendors").mkdir(parents=True)
        (root / "etc/OpenCL/vendors/adreno.icd").write_text("libOpenCL_adreno.so\n")
    (root / "bin").mkdir()
    return {"GENIEX_SYSROOT": str(root), "GENIEX_MACHINE": arch, "GLSLC": str(root / "bin" / "glslc")}


def with_glslc(env: dict[str, str]) -> dict[str, str]:
    glslc = Path(env["GLSLC"])
    glslc.write_text("#!/bin/sh\n")
    glslc.chmod(0o755)
    return env


def flags(env: dict[str, str], gpu: str | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("GPU", "VULKAN_HEADERS", "HEXAGON_SDK_ROOT")}
    return subprocess.run(["sh", str(SCRIPT)], env={**clean, **env, **({"GPU": gpu} if gpu else {}), **extra},
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def test_x86_without_gpu_build_needs_is_the_cpu_build(tmp_path: Path) -> None:
    out = flags(machine(tmp_path, vulkan=239))  # Debian 12's headers, and no glslc
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON",
                                  "-DGGML_BMI2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]  # fmt: skip  # never AMX


def test_x86_with_vulkan_build_needs_adds_vulkan(tmp_path: Path) -> None:
    out = flags(with_glslc(machine(tmp_path, vulkan=309)))
    assert out.returncode == 0 and "-DGGML_VULKAN=ON" in out.stdout.split(), out.stdout + out.stderr
    assert "OPENCL" not in out.stdout and "HEXAGON" not in out.stdout


def test_headers_too_old_for_auto_and_named_when_asked(tmp_path: Path) -> None:
    env = with_glslc(machine(tmp_path, vulkan=239))
    assert "VULKAN" not in flags(env).stdout
    asked = flags(env, "vulkan")
    assert asked.returncode != 0 and "1.x.239" in asked.stderr and "make vulkan-headers" in asked.stderr
    headers = tmp_path / "newer" / "usr"
    (headers / "include/vulkan").mkdir(parents=True)
    (headers / "include/vulkan/vulkan_core.h").write_text("#define VK_HEADER_VERSION 309\n")
    given = flags(env, "vulkan", VULKAN_HEADERS=str(headers))
    assert given.returncode == 0, given.stderr
    assert f"-DVulkan_INCLUDE_DIR={headers}/include" in given.stdout.split()
    assert f"-DSPIRV-Headers_DIR={headers}/share/cmake/SPIRV-Headers" in given.stdout.split()


def test_vulkan_asked_without_the_loader_or_glslc_names_each(tmp_path: Path) -> None:
    asked = flags(machine(tmp_path, vulkan=309, loader=False), "vulkan")
    assert asked.returncode == 1 and "libvulkan.so.1" in asked.stderr and "glslc" in asked.stderr


def test_x86_with_opencl_builds_it_without_the_adreno_kernels(tmp_path: Path) -> None:
    out = flags(machine(tmp_path, opencl=True, loader=False))
    assert out.stdout.split()[-2:] == ["-DGGML_OPENCL=ON", "-DGGML_OPENCL_USE_ADRENO_KERNELS=OFF"], out.stdout


@pytest.mark.parametrize("sdk", [True, False])
def test_aarch64_builds_hexagon_only_with_an_sdk(tmp_path: Path, sdk: bool) -> None:
    env = machine(tmp_path, arch="aarch64", opencl=True, loader=False)
    extra = {}
    if sdk:
        (tmp_path / "hexagon-sdk").mkdir()
        extra["HEXAGON_SDK_ROOT"] = str(tmp_path / "hexagon-sdk")
    out = flags(env, **extra)
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[0] == "-DGGML_NATIVE=ON"
    assert "-DGGML_OPENCL=ON" in words and "-DGGML_OPENCL_USE_ADRENO_KERNELS=ON" in words  # Snapdragon's Adreno
    assert ("-DGGML_HEXAGON=ON" in words) is sdk
    if sdk:
        assert f"-DHEXAGON_SDK_ROOT={tmp_path / 'hexagon-sdk'}" in words
    else:
        refused = flags(env, "hexagon")
        assert refused.returncode == 1 and "HEXAGON_SDK_ROOT" in refused.stderr


def test_none_and_unknown_backends(tmp_path: Path) -> None:
    env = with_glslc(machine(tmp_path, vulkan=309, opencl=True))
    assert "GGML_VULKAN" not in flags(env, "none").stdout and "GGML_OPENCL" not in flags(env, "none").stdout
    bad = flags(env, "cuda")
    assert bad.returncode == 2 and "unknown backend cuda" in bad.stderr
    both = flags(env, "vulkan,opencl").stdout.split()
    assert "-DGGML_VULKAN=ON" in both and "-DGGML_OPENCL=ON" in both
