#!/usr/bin/env bash
# CUDA without a system toolkit: `toolpair engine install --backend cuda` with NVIDIA's CUDA toolkit from
# PyPI (TOOLPAIR_CUDA_TOOLKIT=pypi, so a system nvcc is not used), for one architecture (sm_90, H100/H200),
# into its own virtualenv (.venv-cuda). Then, on a machine without an NVIDIA driver, what `toolpair serve`
# says on that build. Run by `make cuda-build-check`; not part of `make test`.
#
# Knobs: LIMIT (seconds the build may take, default 3600; it is stopped after that and the script says
# how far it got), NICE (default 19), CUDA_ARCH (default 90), CUDA_VENV (default .venv-cuda), JOBS (default:
# the number of cores).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CUDA_VENV=${CUDA_VENV:-.venv-cuda}
LIMIT=${LIMIT:-3600}
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}  # ninja would run cores+2 nvcc at once, 2-4 GB each
export TOOLPAIR_CUDA_TOOLKIT=pypi
# Each CUDA compile's CPU seconds (scripts/compile_cost.sh), so a stopped build still says what the
# whole one costs, by kind of file (bench/cuda_build_cost.py).
export COMPILE_COST_LOG=${COMPILE_COST_LOG:-$PWD/.cuda-compile-cost.log}
rm -f "$COMPILE_COST_LOG" "$COMPILE_COST_LOG.targets"
export CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DCMAKE_CUDA_COMPILER_LAUNCHER=$PWD/scripts/compile_cost.sh"
now() { date +%s; }

[[ -x "$CUDA_VENV/bin/python" ]] || "$PYTHON" -m venv "$CUDA_VENV"
"$CUDA_VENV/bin/python" -m pip install --disable-pip-version-check -q -e '.[model]' || exit 1
log=$(mktemp)
echo "== engine install --backend cuda (PyPI toolkit, CMAKE_ARGS=$CMAKE_ARGS, limit ${LIMIT}s, nice ${NICE:-19})"
started=$(now)
setsid nice -n "${NICE:-19}" "$CUDA_VENV/bin/toolpair" engine install --backend cuda >"$log" 2>&1 &
pid=$!
# setsid gives the build a scheduler autogroup of its own, and with autogroups on, nice counts only
# inside a group: without this the "nice 19" build takes half the machine from everything else.
sleep 1; echo "${NICE:-19}" > "/proc/$pid/autogroup" 2>/dev/null || true
while kill -0 "$pid" 2>/dev/null && (( $(now) - started < LIMIT )); do sleep 10; done
if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null; sleep 5; kill -KILL -- "-$pid" 2>/dev/null
    finished=no
else
    wait "$pid"; code=$?
    finished=$([[ $code == 0 ]] && echo yes || echo "failed ($code)")
fi
elapsed=$(( $(now) - started ))
cat "$log"
build_log=$(sed -n 's/.*full log: \(.*build.log\).*/\1/p' "$log" | head -1)
echo "== result: finished: $finished after ${elapsed}s"
if [[ -n "$build_log" && -f "$build_log" ]]; then
    last=$(grep -oE '^\s*\[[0-9]+/[0-9]+\]' "$build_log" | tail -1 | tr -d ' []')
    echo "ninja steps done: ${last:-none}"
    total_cu=$(grep -cE '\.cu(\.o)? ' "$build_log" || true)
    echo "CUDA compile steps logged: $total_cu"
    echo "last steps:"; grep -E '^\s*\[[0-9]+/[0-9]+\]' "$build_log" | tail -3 | sed -E 's/ -[^ ]+//g' | cut -c1-200
fi
echo "== what the CUDA compiles cost, by kind (CPU seconds; the build ran at nice ${NICE:-19})"
"$CUDA_VENV/bin/python" bench/cuda_build_cost.py "$COMPILE_COST_LOG"
[[ $finished == yes ]] || exit 3

echo "== toolpair serve on the CUDA build"
if nvidia-smi -L >/dev/null 2>&1; then
    echo "an NVIDIA driver is here: run scripts/gpu_check.sh for the end-to-end GPU check"
    exit 0
fi
out=$("$CUDA_VENV/bin/toolpair" serve --port 18787 2>&1 </dev/null); code=$?
echo "$out" | tail -3
echo "exit status: $code"
[[ $code == 2 ]] && grep -q "no CUDA driver was found" <<<"$out"
