#!/bin/sh
# The CMake flags that build llama.cpp for this machine (read by the Makefile): the CPU's
# instruction sets, then the GPU and NPU backends the machine can build.
#
# CPU. Arm (a Snapdragon laptop, a Raspberry Pi, Apple silicon): a native build, so that the
# dot-product and int8 matrix instructions the CPU has are used. x86-64: the instruction sets
# /proc/cpuinfo lists, named one by one rather than -march=native, because some VMs advertise AMX
# and then trap on it; AMX is never turned on. Anything else: a portable build.
#
# Backends, by GPU (a make variable and environment variable):
#   auto (the default)  every backend whose build needs are all present:
#     vulkan   the Vulkan loader (libvulkan.so.1), glslc, and Vulkan headers new enough for the
#              vendored llama.cpp (VK_HEADER_VERSION >= 272; Debian 12's 239 are not: see
#              VULKAN_HEADERS)
#     opencl   the OpenCL headers (CL/cl.h) and an ICD (/etc/OpenCL/vendors/*.icd); on aarch64 with
#              Qualcomm's Adreno kernels. llama.cpp's OpenCL backend runs on Adreno and Intel GPUs only
#     hexagon  aarch64 with HEXAGON_SDK_ROOT naming a Hexagon SDK (llama.cpp's own NPU backend)
#   none                the CPU only
#   vulkan,opencl,...   exactly these; the script fails, naming what is missing, when one cannot be built
# VULKAN_HEADERS: a prefix (its include/ and share/cmake/SPIRV-Headers/) of Vulkan and SPIR-V headers
# newer than the system's; `make vulkan-headers` fetches Debian 13's into ~/.cache/geniex/.
# GENIEX_SYSROOT, GENIEX_MACHINE, GENIEX_CPUINFO, GLSLC: probe another machine's files (the unit tests).
set -eu

ROOT=${GENIEX_SYSROOT:-}
MACHINE=${GENIEX_MACHINE:-$(uname -m)}
CPUINFO=${GENIEX_CPUINFO:-$ROOT/proc/cpuinfo}
GPU=${GPU:-auto}
MIN_VK_HEADERS=272

cpu_flags() {
    case "$MACHINE" in
    aarch64 | arm64)
        echo "-DGGML_NATIVE=ON"
        ;;
    x86_64 | amd64)
        flags=$(grep -m1 '^flags' "$CPUINFO" 2>/dev/null || true)
        if [ -z "$flags" ]; then
            echo "-DGGML_NATIVE=OFF"
            return
        fi
        out="-DGGML_NATIVE=OFF"
        has() { case " $flags " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
        for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI bmi2:BMI2 fma:FMA f16c:F16C \
            avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
            if has "${pair%%:*}"; then
                out="$out -DGGML_${pair#*:}=ON"
            fi
        done
        echo "$out"
        ;;
    *)
        echo "-DGGML_NATIVE=OFF"
        ;;
    esac
}

aarch64() { case "$MACHINE" in aarch64 | arm64) return 0 ;; *) return 1 ;; esac; }

# Whether any of the paths (globs expanded by the caller) exists.
exists() {
    for f in "$@"; do
        if [ -e "$f" ]; then return 0; fi
    done
    return 1
}

# Why each backend cannot be built here ("" when it can).
vulkan_missing() {
    why=""
    exists "$ROOT"/usr/lib/*/libvulkan.so.1 "$ROOT"/usr/lib/libvulkan.so.1 ||
        why="$why the Vulkan loader (libvulkan.so.1; Debian: libvulkan-dev);"
    command -v "${GLSLC:-glslc}" >/dev/null 2>&1 || why="$why glslc (Debian: glslc glslang-tools);"
    headers=${VULKAN_HEADERS:+$VULKAN_HEADERS/include}
    headers=${headers:-$ROOT/usr/include}
    version=$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$headers/vulkan/vulkan_core.h" 2>/dev/null || true)
    if [ -z "$version" ]; then
        why="$why Vulkan headers ($headers/vulkan/vulkan_core.h);"
    elif [ "$version" -lt "$MIN_VK_HEADERS" ]; then
        why="$why Vulkan headers newer than $headers's 1.x.$version (at least $MIN_VK_HEADERS: make vulkan-headers);"
    fi
    echo "$why"
}

opencl_missing() {
    why=""
    [ -f "$ROOT/usr/include/CL/cl.h" ] || why="$why the OpenCL headers (Debian: opencl-headers ocl-icd-opencl-dev);"
    exists "$ROOT"/etc/OpenCL/vendors/*.icd || why="$why an OpenCL driver (an ICD in /etc/OpenCL/vendors);"
    echo "$why"
}

hexagon_missing() {
    why=""
    aarch64 || why="$why an aarch64 host;"
    [ -n "${HEXAGON_SDK_ROOT:-}" ] && [ -d "${HEXAGON_SDK_ROOT:-}" ] || why="$why HEXAGON_SDK_ROOT naming a Hexagon SDK;"
    echo "$why"
}

backend_flags() {
    case "$1" in
    vulkan)
        out="-DGGML_VULKAN=ON"
        if [ -n "${VULKAN_HEADERS:-}" ]; then
            out="$out -DVulkan_INCLUDE_DIR=$VULKAN_HEADERS/include -DSPIRV-Headers_DIR=$VULKAN_HEADERS/share/cmake/SPIRV-Headers"
        fi
        echo "$out"
        ;;
    opencl)
        if aarch64; then
            echo "-DGGML_OPENCL=ON -DGGML_OPENCL_USE_ADRENO_KERNELS=ON"
        else
            echo "-DGGML_OPENCL=ON -DGGML_OPENCL_USE_ADRENO_KERNELS=OFF"
        fi
        ;;
    hexagon)
        out="-DGGML_HEXAGON=ON -DHEXAGON_SDK_ROOT=$HEXAGON_SDK_ROOT"
        if [ -n "${HEXAGON_TOOLS_ROOT:-}" ]; then
            out="$out -DHEXAGON_TOOLS_ROOT=$HEXAGON_TOOLS_ROOT"
        fi
        echo "$out"
        ;;
    esac
}

out=$(cpu_flags)
case "$GPU" in
auto)
    for backend in vulkan opencl hexagon; do
        if [ -z "$("${backend}_missing")" ]; then
            out="$out $(backend_flags "$backend")"
        fi
    done
    ;;
none | cpu | "") ;;
*)
    for backend in $(echo "$GPU" | tr ',' ' '); do
        case "$backend" in
        vulkan | opencl | hexagon) ;;
        *)
            echo "GPU=$GPU: unknown backend $backend (auto, none, or a list of vulkan, opencl, hexagon)" >&2
            exit 2
            ;;
        esac
        missing=$("${backend}_missing")
        if [ -n "$missing" ]; then
            echo "GPU=$GPU: the $backend backend cannot be built here; missing:$missing" >&2
            exit 1
        fi
        out="$out $(backend_flags "$backend")"
    done
    ;;
esac
echo "$out"
