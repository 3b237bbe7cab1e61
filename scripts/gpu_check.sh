#!/usr/bin/env bash
# GPU check for the managed engine: build llama-cpp-python for CUDA (sm_90 only, to keep the build
# short), serve the bundled model with every layer offloaded, send one chat request, and print the
# backend, whether GPU offload is supported, the engine's offload line and the timings.
#
# Run from the repository root on a machine with an NVIDIA GPU, the CUDA toolkit (nvcc), python3
# and pip. It makes its own virtualenv (.venv-gpu) and cache (.gpu-cache) in the checkout.
#
#   scripts/gpu_check.sh                 # uses PyPI
#   WHEELHOUSE=/path scripts/gpu_check.sh   # offline: every package from that directory
#   scripts/gpu_check.sh prepare DIR     # on a networked machine: fill DIR for the offline run
#
# Other knobs: MODEL=/path/model.gguf (default: the bundled Gemma 3 270M), CUDA_ARCH (default 90),
# SERVE_ARGS="..." (more `toolpair serve` flags, e.g. "-c 8192 -fa on"; the defaults are the full
# training context, every layer on the GPU, logprobs off, a 1 GiB prompt cache),
# SYSTEM_SITE=1 (the virtualenv sees the machine's own packages: for an offline machine whose python3
# already has aiohttp, PyYAML, numpy and jinja2; MODEL is then required), MODEL_WAIT=SECONDS (wait
# that long for MODEL to appear, when it is copied onto the machine while the engine builds).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# The pin is written once, in engine_launcher/builder/version.py (stdlib only: any python3 reads it).
LLAMA_VERSION=$("$PYTHON" -c 'from engine_launcher.builder.version import LLAMA_CPP_VERSION as v; print(v)')
LLAMA=llama-cpp-python==$LLAMA_VERSION

if [[ "${1:-}" == prepare ]]; then
    dir=${2:?usage: scripts/gpu_check.sh prepare DIR}
    mkdir -p "$dir"
    # Binary wheels fit the Python that runs this: use the same version as the GPU machine's python3.
    "$PYTHON" -m pip download -d "$dir" --no-binary llama-cpp-python "llama-cpp-python[server]==$LLAMA_VERSION"
    "$PYTHON" -m pip download -d "$dir" "scikit-build-core[pyproject]>=0.9.2" cmake ninja setuptools wheel
    "$PYTHON" -m pip download -d "$dir" ".[model]"
    du -sh "$dir"
    exit 0
fi

if [[ -n "${WHEELHOUSE:-}" ]]; then
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"
fi
export TOOLPAIR_CACHE=${TOOLPAIR_CACHE:-$PWD/.gpu-cache}
export CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
VENV=${VENV:-.venv-gpu}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

echo "== machine"
nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv,noheader || true
nvcc --version | tail -1 || echo "nvcc not found"

t=$(now)
if [[ -n "${SYSTEM_SITE:-}" ]]; then
    : "${MODEL:?SYSTEM_SITE=1 needs MODEL=/path/model.gguf}"
    "$PYTHON" -m venv --system-site-packages "$VENV"
    # When $PYTHON is itself a virtualenv, --system-site-packages reaches only its base: add its own
    # site-packages too (after the new venv's, so what is installed here wins).
    parent=$("$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))')
    child=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "$parent" > "$child/_parent_site.pth"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation -e .
else
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[model]'
fi
setup_s=$(since "$t")

echo "== build and install (CMAKE_ARGS=$CMAKE_ARGS)"
t=$(now)
"$VENV/bin/toolpair" engine detect
"$VENV/bin/toolpair" engine install --backend cuda
build_s=$(since "$t")

if [[ -n "${MODEL_WAIT:-}" ]]; then
    for _ in $(seq "$MODEL_WAIT"); do [[ -f "$MODEL" ]] && break; sleep 1; done
fi

port=$("$VENV/bin/python" -c "from engine_launcher.supervise.launch import free_port; print(free_port())")
log=$(mktemp -d)/serve.log
echo "== serve on port $port (log: $log)"
t=$(now)
# Debug level: the engine's loader lines (the offload line below) stay out of the default output.
# shellcheck disable=SC2086
"$VENV/bin/toolpair" serve --port "$port" --log-level debug ${MODEL:+--model "$MODEL"} ${SERVE_ARGS:-} >"$log" 2>&1 &
serve_pid=$!
trap 'kill -TERM $serve_pid 2>/dev/null || true' EXIT
"$VENV/bin/python" - "$port" "$serve_pid" <<'EOF'
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("toolpair serve exited before it was ready")
    time.sleep(0.1)
sys.exit("toolpair serve was not ready in 600s")
EOF
ready_s=$(since "$t")

echo "== one chat request"
"$VENV/bin/python" - "$port" <<'EOF'
import json, sys, time, urllib.request
body = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 32, "temperature": 0}
request = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json"},
)
started = time.monotonic()
reply = json.load(urllib.request.urlopen(request, timeout=300))
took = time.monotonic() - started
usage = reply["usage"]
print("reply:", json.dumps(reply["choices"][0]["message"]["content"]))
print(f"chat request: {took:.2f}s, {usage['completion_tokens']} tokens, "
      f"{usage['completion_tokens'] / took:.1f} tokens/s including the prompt")
EOF

echo "GPU memory in use while serving: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | head -1)"
engine_pid=$(pgrep -P "$serve_pid" -f llama_cpp.server | head -1 || true)
[[ -n "$engine_pid" ]] && echo "engine RSS: $(awk '/VmRSS/ {print $2, $3}' "/proc/$engine_pid/status")"

kill -TERM "$serve_pid"
wait "$serve_pid" || true
trap - EXIT

echo "== results"
echo "install record: $(cat "$VENV/share/toolpair/engine.json" | tr -d '\n' | tr -s ' ')"
"$VENV/bin/python" -c "import llama_cpp; print('llama_supports_gpu_offload():', llama_cpp.llama_supports_gpu_offload())"
grep -E "offloaded [0-9]+/[0-9]+ layers to GPU" "$log" | sed 's/^.*engine: /engine: /' || echo "no offload line in the engine log"
grep -E "engine ready in" "$log" | sed 's/^.*INFO //' || true
grep -E "^  (engine|memory|logprobs|prompt cache): " "$log" || true
echo "timings: venv ${setup_s}s, build+install ${build_s}s, serve to ready ${ready_s}s"
