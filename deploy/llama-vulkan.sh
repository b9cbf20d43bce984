#!/bin/sh
# llama.cpp built with its Vulkan backend, beside the venv's own build: the GPU path's tests run
# on Mesa's lavapipe (a Vulkan device on the CPU) with this build, on any Linux box, GPU or not.
# The wheel is kept in ~/.cache/geniex/wheels/<key> like the CPU one (compiled once per machine:
# about 15 minutes on 2 cores, most of it the shaders), and installed into VENV/vulkan, a venv of
# its own whose site-packages also reads VENV's (a .pth file): its python runs everything from
# VENV but llama_cpp, and so do the workers a server started with it spawns (they run with -I, so
# no PYTHONPATH would reach them).
# As root on Debian/Ubuntu, the build's packages are installed with apt; elsewhere they must be.
# Usage: deploy/llama-vulkan.sh VENV LLAMA_CPP_REQUIREMENT
set -eu

venv=${1:?usage: deploy/llama-vulkan.sh VENV LLAMA_CPP_REQUIREMENT}
llama=${2:?usage: deploy/llama-vulkan.sh VENV LLAMA_CPP_REQUIREMENT}
here=$(dirname "$0")
cache="$HOME/.cache/geniex"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    missing=""
    for pkg in mesa-vulkan-drivers libvulkan-dev glslc glslang-tools; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing="$missing $pkg"
    done
    if [ -n "$missing" ]; then
        echo "installing$missing" >&2
        apt-get -q update >&2 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >&2
    fi
fi

if ! args=$(GPU=vulkan sh "$here/llama-cmake-args.sh" 2>/dev/null); then
    headers=$(sh "$here/vulkan-headers.sh" "$cache/vulkan-headers/trixie")
    args=$(GPU=vulkan VULKAN_HEADERS="$headers" sh "$here/llama-cmake-args.sh")
fi
key=$(python3 -c 'import hashlib, sys; print(hashlib.sha256(" ".join(sys.argv[1:]).encode()).hexdigest()[:16])' \
    "$llama" "$(uname -m)" "$args")
wheels="$cache/wheels/$key"
target="$venv/vulkan"
if [ -f "$target/.key" ] && [ "$(cat "$target/.key")" = "$key" ]; then
    echo "$target"
    exit 0
fi
if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "building $llama with Vulkan ($args) into $wheels" >&2
    CMAKE_ARGS="$args" "$venv/bin/python" -m pip --disable-pip-version-check -q wheel --no-deps --no-cache-dir \
        "$llama" -w "$wheels" >&2
fi
rm -rf "$target"
"$venv/bin/python" -m venv --without-pip "$target"
main_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
own_site=$("$target/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$venv/bin/python" -m pip --disable-pip-version-check -q install --no-deps --target "$own_site" \
    "$wheels"/llama_cpp_python-*.whl >&2
# After its own site-packages on sys.path, so this llama_cpp wins; addsitedir reads VENV's .pth files too.
echo "import site; site.addsitedir('$main_site')" >"$own_site/zz-geniex-main-venv.pth"
echo "$key" >"$target/.key"
echo "$target"
