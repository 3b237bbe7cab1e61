#!/usr/bin/env bash
# Vulkan headers new enough for the vendored llama.cpp, for a Debian 12 machine.
#
# llama.cpp (llama-cpp-python 0.3.36) uses VK_EXT_layer_settings (Vulkan-Headers 1.3.261 and later);
# Debian 12's libvulkan-dev is 1.3.239, and bookworm-backports has no newer one. This fetches Debian 13's
# libvulkan-dev .deb (headers only are used; signed by Debian's archive key, already on the machine)
# with a private apt configuration, unpacks it into DIR (default $TOOLPAIR_CACHE/vulkan-headers, i.e.
# ~/.cache/toolpair/vulkan-headers) and prints the include directory to give CMake:
#
#   CMAKE_ARGS="-DVulkan_INCLUDE_DIR=$(scripts/vulkan_headers.sh)" toolpair engine install --backend vulkan
#
# The system's headers are printed instead when they are new enough. The machine's apt sources are left alone.
set -euo pipefail
MIN=261
system=/usr/include/vulkan/vulkan_core.h
version() { sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$1" 2>/dev/null | head -1; }
have=$(version "$system")
if [[ -n "$have" ]] && (( have >= MIN )); then
    echo /usr/include
    exit 0
fi
dir=${1:-${TOOLPAIR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolpair}/vulkan-headers}
if [[ -f "$dir/usr/include/vulkan/vulkan_core.h" ]] && (( $(version "$dir/usr/include/vulkan/vulkan_core.h") >= MIN )); then
    echo "$dir/usr/include"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
cat > "$work/trixie.sources" <<SOURCES
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
apt=(-o "Dir::Etc::sourcelist=$work/trixie.sources" -o Dir::Etc::sourceparts=/dev/null -o "Dir::State::Lists=$work/lists"
     -o "Dir::Cache::archives=$work/archives" -o APT::Sandbox::User=root)
echo "system Vulkan headers are ${have:-absent} (llama.cpp needs 1.3.$MIN+): fetching Debian 13's libvulkan-dev" >&2
apt-get "${apt[@]}" update -qq >&2
(cd "$work" && apt-get "${apt[@]}" download libvulkan-dev >&2)
mkdir -p "$dir"
dpkg-deb -x "$work"/libvulkan-dev_*.deb "$work/x"
rm -rf "$dir/usr"
mkdir -p "$dir/usr"
cp -r "$work/x/usr/include" "$dir/usr/include"
echo "$dir/usr/include"
