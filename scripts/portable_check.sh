#!/usr/bin/env bash
# Show that a portable engine build runs on an older CPU than this one (`make portable-check`, as root).
#
#   1. installs Debian's qemu-user-static when missing (qemu-x86_64: runs a program as another x86 CPU);
#   2. builds the portable engine (`toolpair engine install --portable`: llama.cpp's x86-64-v3 baseline,
#      no AVX-512, no AMX) into .venv-portable, and the native one into .venv as `make test` does;
#   3. starts each as `toolpair serve` does (supervisor, warm-up generation) with the engine process under
#      the emulated CPU ($PORTABLE_CHECK_CPU, default Haswell, the oldest x86-64-v3 CPU): the portable
#      build must generate; the native build's fate is reported (on a machine whose native code needs
#      more than that CPU has, AVX-512 say, it dies with SIGILL);
#   4. shows toolpair naming a real SIGILL: the native build on an emulated CPU without AVX2 (SandyBridge);
#   5. prints tokens/s of both builds on this CPU, same run (native vs portable).
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
MODEL=$(.venv/bin/python -c 'from engine_launcher.builder.models import bundled_model; print(bundled_model())')

# The engine started as `toolpair serve` starts it (its supervisor, its warm-up generation), but under
# qemu -cpu $2, with the toolpair of virtualenv $1; prints toolpair's verdict, fails as the verdict does.
emulated() { timeout 1200 "$1/bin/python" scripts/emulated_serve_check.py "$QEMU" "$2" 2>/dev/null; }

say "the portable engine under qemu -cpu $CPU"
started=$(date +%s)
PORTABLE=$(emulated .venv-portable "$CPU") || fail "the portable engine did not run on $CPU: $PORTABLE"
say "$PORTABLE; $(( $(date +%s) - started ))s in all"

say "this machine's native engine under qemu -cpu $CPU"
if NATIVE=$(emulated .venv "$CPU"); then
    say "$NATIVE: it ran too; nothing this CPU's native code uses is missing on $CPU (it has no AVX-512)"
else
    say "$NATIVE"
fi

OLDER=${PORTABLE_CHECK_OLDER_CPU:-SandyBridge}
say "this machine's native engine under qemu -cpu $OLDER (no AVX2): what toolpair says about a build for another CPU"
if SAID=$(emulated .venv "$OLDER"); then fail "the native engine ran on $OLDER, which has no AVX2: $SAID"; fi
grep -q "crashed with SIGILL (illegal instruction)" <<<"$SAID" || fail "not named as SIGILL: $SAID"
say "$SAID"

say "speed on this CPU (tokens/s, best of 3, same run)"
for venv in .venv .venv-portable; do
    printf '   %-15s %s\n' "$venv" "$("$venv/bin/python" -m engine_launcher.inside.speed "$MODEL" --prompt-tokens 256 --gen-tokens 32)"
done
say "portable check passed"
