#!/usr/bin/env bash
# Show that a portable engine build runs on an older CPU than this one (`make portable-check`, as root).
#
#   1. installs Debian's qemu-user-static when missing (qemu-x86_64: runs a program as another x86 CPU);
#   2. builds the portable engine (`toolpair engine install --portable`: llama.cpp's x86-64-v3 baseline,
#      no AVX-512, no AMX) into .venv-portable, and the native one into .venv as `make test` does;
#   3. runs each under the emulated CPU ($PORTABLE_CHECK_CPU, default Haswell, the oldest x86-64-v3 CPU):
#      the portable build must load the bundled model and generate; the native build's fate is reported:
#      on a machine whose native code needs more than that CPU has (AVX-512, AMX...) it dies with SIGILL;
#   4. prints tokens/s of both builds on this CPU, same run (native vs portable).
#
# Not part of `make test`: the portable build alone takes as long as the native one (minutes).
set -euo pipefail
say() { printf '== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
trap 'code=$?; fail "line $LINENO: \`$BASH_COMMAND\` exited with status $code"' ERR

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CPU=${PORTABLE_CHECK_CPU:-Haswell}
PYTHON=${PYTHON:-python3}
WORK=${PORTABLE_CHECK_DIR:-/var/tmp/toolpair-portable-check}
mkdir -p "$WORK"

QEMU=$(command -v qemu-x86_64-static || command -v qemu-x86_64 || true)
if [[ -z $QEMU ]]; then
    say "installing qemu-user-static"
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        qemu-user-static >/dev/null
    QEMU=$(command -v qemu-x86_64-static)
fi
[[ $(uname -m) == x86_64 ]] || fail "this check emulates an x86-64 CPU; this machine is $(uname -m)"

engine() {  # VENV FLAGS...: a virtualenv with toolpair and the engine built with FLAGS
    local venv=$1; shift
    [[ -x $venv/bin/python ]] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip --disable-pip-version-check -q install -e '.[model]' >"$WORK/pip.log" 2>&1 \
        || { tail -n 20 "$WORK/pip.log" >&2; fail "pip install into $venv failed"; }
    "$venv/bin/toolpair" engine install --backend cpu "$@" 2>&1 | sed 's/^/   /'
}
say "native engine (.venv)"
engine .venv
say "portable engine (.venv-portable)"
engine .venv-portable --portable
MODEL=$(.venv/bin/python -c 'from engine_launcher.models import bundled_model; print(bundled_model())')

# One short generation under the emulated CPU; prints "ok <json>" or "died <status>".
emulated() {
    local venv=$1 log=$WORK/$(basename "$1").log code=0
    timeout 900 "$QEMU" -cpu "$CPU" "$venv/bin/python" -m engine_launcher.speed "$MODEL" \
        --prompt-tokens 8 --gen-tokens 4 --repeats 1 >"$log" 2>&1 || code=$?
    if [[ $code == 0 ]]; then echo "ok $(tail -n1 "$log")"; else echo "died $code"; fi
}
signal_of() { "$PYTHON" -c 'import sys, signal; c = int(sys.argv[1]); print(signal.Signals(c - 128).name if c > 128 else f"status {c}")' "$1"; }

say "under qemu -cpu $CPU: the portable engine"
started=$(date +%s)
PORTABLE=$(emulated .venv-portable)
[[ $PORTABLE == ok* ]] || { tail -n 20 "$WORK/.venv-portable.log" >&2; fail "the portable engine did not run on $CPU: $(signal_of "${PORTABLE#died }")"; }
say "portable engine on $CPU: answered in $(( $(date +%s) - started ))s: ${PORTABLE#ok }"

say "under qemu -cpu $CPU: this machine's native engine"
NATIVE=$(emulated .venv)
if [[ $NATIVE == ok* ]]; then
    say "native engine on $CPU: it ran too: nothing this CPU's native code uses is missing on $CPU (no AVX-512 here)"
else
    say "native engine on $CPU: died with $(signal_of "${NATIVE#died }") (log: $WORK/.venv.log)"
fi

say "speed on this CPU (tokens/s, best of 3, same run)"
for venv in .venv .venv-portable; do
    printf '   %-15s %s\n' "$venv" "$("$venv/bin/python" -m engine_launcher.speed "$MODEL" --prompt-tokens 256 --gen-tokens 32)"
done
say "portable check passed"
