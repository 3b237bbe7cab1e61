#!/usr/bin/env bash
# Vulkan end to end on Mesa's software Vulkan device (llvmpipe), on a machine without a GPU:
# build llama-cpp-python for Vulkan into its own virtualenv (.venv-vulkan; .venv keeps the CPU
# engine), serve the bundled model with every layer on the Vulkan device, run the real-engine tests
# of the three APIs on that build, and measure its tokens/s next to the CPU build's.
#
# Run by `make vulkan-check`, which first installs the Vulkan build tools and Mesa's driver
# (`make vulkan-deps`) and the CPU engine into .venv. Not part of `make test` (see docs/engine.md).
# Knobs: VULKAN_VENV (default .venv-vulkan), NICE (default 10, for the build).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VULKAN_VENV=${VULKAN_VENV:-.venv-vulkan}
now() { date +%s; }

echo "== Vulkan devices"
vulkaninfo --summary 2>/dev/null | grep -E "deviceType|deviceName" || { echo "vulkaninfo lists no device"; exit 1; }
echo "auto-detection gives: $(.venv/bin/toolpair engine detect | head -1)"

if [[ ! -x "$VULKAN_VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VULKAN_VENV"
fi
"$VULKAN_VENV/bin/python" -m pip install --disable-pip-version-check -q -e '.[test,model]'

# Debian 12's Vulkan headers are older than llama.cpp needs: newer ones, for this build only.
headers=$(scripts/vulkan_headers.sh)
if [[ "$headers" != /usr/include ]]; then
    export CMAKE_ARGS="${CMAKE_ARGS:+$CMAKE_ARGS }-DVulkan_INCLUDE_DIR=$headers"
fi

echo "== engine install --backend vulkan (a cached wheel is reused)"
t=$(now)
nice -n "${NICE:-10}" "$VULKAN_VENV/bin/toolpair" engine install --backend vulkan
echo "vulkan engine install: $(( $(now) - t ))s"

echo "== toolpair serve on the Vulkan build: banner, offload, the three APIs"
t=$(now)
TOOLPAIR_VULKAN_PYTHON="$VULKAN_VENV/bin/python" .venv/bin/python -m pytest -q -p no:cacheprovider tests/engine_launcher/test_vulkan.py
echo "serve tests: $(( $(now) - t ))s"

echo "== the real-engine tests of the three APIs, with the Vulkan engine (every layer offloaded)"
t=$(now)
"$VULKAN_VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/engine/test_real_engine_smoke.py tests/engine/test_engine_real.py \
    tests/dialects/anthropic/test_anthropic_real_engine.py tests/dialects/responses/test_responses_real_engine.py
echo "real-engine tests on Vulkan: $(( $(now) - t ))s"

echo "== tokens/s: Vulkan build (llvmpipe) next to the CPU build, same run"
.venv/bin/python bench/vulkan_vs_cpu.py --vulkan-python "$VULKAN_VENV/bin/python"
