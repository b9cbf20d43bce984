#!/bin/sh
# Vulkan and SPIR-V headers new enough for the vendored llama.cpp's Vulkan backend, for a
# distribution whose own are older (Debian 12 ships 1.3.239; ggml-vulkan.cpp needs
# vk::LayerSettingEXT). Debian 13's libvulkan-dev and spirv-headers packages are downloaded with
# apt into a private apt state (nothing of the system's apt setup or packages changes) and unpacked,
# not installed, into DEST; the build still links the system's Vulkan loader.
# Usage: deploy/vulkan-headers.sh DEST   (prints the prefix to pass as VULKAN_HEADERS)
set -eu

dest=${1:?usage: deploy/vulkan-headers.sh DEST}
prefix="$dest/usr"
if [ -f "$prefix/include/vulkan/vulkan_core.h" ] && [ -d "$prefix/share/cmake/SPIRV-Headers" ]; then
    echo "$prefix"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
    echo "no apt here: install Vulkan headers 1.3.272 or newer (Vulkan-Headers, SPIRV-Headers) and pass VULKAN_HEADERS=PREFIX" >&2
    exit 1
fi
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs"
echo "deb http://deb.debian.org/debian trixie main" >"$state/sources.list"
set -- -o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/nonexistent \
    -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o APT::Sandbox::User=root -q
apt-get "$@" update >&2
(cd "$state/debs" && apt-get "$@" download libvulkan-dev spirv-headers >&2)
mkdir -p "$dest"
for deb in "$state"/debs/*.deb; do
    dpkg -x "$deb" "$dest"
done
echo "$prefix"
