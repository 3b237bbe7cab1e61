#!/usr/bin/env bash
# A compiler launcher (CMAKE_CUDA_COMPILER_LAUNCHER) that records what each compile cost in CPU
# seconds, for scripts/cuda_build_check.sh: on a loaded machine wall time says little, CPU time
# (user + sys of the compiler and its children) is what a build on N idle cores divides by N.
# Appends "user sys wall source" to $COMPILE_COST_LOG; on its first call it also saves the list of
# every CUDA object in the build (from build.ninja in the build directory ninja runs it from), so the
# check can say what was left when it stopped.
set -u
log=${COMPILE_COST_LOG:?set COMPILE_COST_LOG}
if [[ ! -s "$log.targets" && -f build.ninja ]]; then
    grep -oE '[^ :]+\.cu\.o' build.ninja | sort -u > "$log.targets"
fi
source=unknown
for arg in "$@"; do [[ $arg == *.cu ]] && source=$arg; done
TIMEFORMAT="%U %S %R ${source##*/ggml-cuda/}"
{ time "$@" 2>&3; } 3>&2 2>>"$log"
