#!/bin/sh
# The CMake flags that build llama.cpp for the CPU this runs on (read by the Makefile).
#
# Arm (a Snapdragon laptop, a Raspberry Pi, Apple silicon): a native build, so that the
# dot-product and int8 matrix instructions the CPU has are used.
# x86-64: the instruction sets /proc/cpuinfo lists, named one by one rather than -march=native,
# because some VMs advertise AMX and then trap on it; AMX is never turned on.
# Anything else: a portable build.
set -eu

case "$(uname -m)" in
aarch64 | arm64)
    echo "-DGGML_NATIVE=ON"
    ;;
x86_64 | amd64)
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
    if [ -z "$flags" ]; then
        echo "-DGGML_NATIVE=OFF"
        exit 0
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
