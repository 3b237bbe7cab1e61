#!/usr/bin/env bash
# Build the CPU image and show it working as the README says (`make docker-check`, run as root).
#
#   1. installs Docker (Debian's docker.io) and debootstrap when missing, starts dockerd when it is not running;
#   2. makes the base image from Debian with debootstrap when the registry image cannot be pulled;
#   3. builds toolpair:cpu with BuildKit;
#   4. runs it with the bundled model and with a mounted model: each must reach /ready, answer a chat
#      request, turn healthy, run as non-root and stop within the grace period on `docker stop`;
#      a mounted model the container cannot read must fail with one clear line, not a traceback;
#   5. runs the image's engine on an emulated older CPU (qemu-x86_64 -cpu Haswell, from Debian's
#      qemu-user-static): the image is built portable, so it must generate there;
#   6. prints the figures: build time, time to /ready, stop time, image size.
#
# Not part of `make test`: the image build alone takes about ten minutes on a small machine.
# Settings (environment): DOCKER (client binary), IMAGE, DOCKER_CHECK_DIR (work files), DOCKER_CHECK_PORT.
set -euo pipefail

DOCKER=${DOCKER:-/usr/bin/docker}
IMAGE=${IMAGE:-toolpair:cpu}
BASE_IMAGE=python:3.11-slim-bookworm
WORK=${DOCKER_CHECK_DIR:-/var/tmp/toolpair-docker-check}
PORT=${DOCKER_CHECK_PORT:-18787}
GRACE=10  # docker stop's default
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NAME=toolpair-docker-check

say() { printf '== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
# Any other command that fails ends the script: say which, instead of stopping without a word.
trap 'code=$?; fail "line $LINENO: \`$BASH_COMMAND\` exited with status $code"' ERR
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

mkdir -p "$WORK"
cd "$ROOT"

# --- 1. Docker itself -------------------------------------------------------------------------
if [[ ! -x $DOCKER ]] || ! command -v debootstrap >/dev/null || ! command -v dockerd >/dev/null \
    || ! command -v qemu-x86_64-static >/dev/null; then
    say "installing docker.io, debootstrap and qemu-user-static"
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap qemu-user-static
    [[ -x $DOCKER ]] || DOCKER=/usr/bin/docker
fi
if ! "$DOCKER" info >/dev/null 2>&1; then
    say "starting dockerd (log: $WORK/dockerd.log)"
    setsid dockerd >"$WORK/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
    "$DOCKER" info >/dev/null 2>&1 || fail "dockerd did not start; see $WORK/dockerd.log"
fi

# --- 2. the base image ------------------------------------------------------------------------
# pip settings for the rootfs: the machine's, less what points at files that only exist here.
pip_settings() {
    python3 - <<'EOF'
import os, re, subprocess
listing = subprocess.run(["python3", "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
keep = {}
for line in listing.splitlines():
    m = re.match(r"^(?::env:|global|install|download|wheel)\.([\w-]+)='(.*)'$", line)
    if not m:
        continue
    key, value = m.groups()
    if key in ("find-links", "constraint", "requirement"):
        continue
    if key in ("index-url", "extra-index-url", "trusted-host"):
        value = " ".join(v for v in value.split() if not v.startswith("file:"))
        if not value:
            continue
    keep[key] = value
print("[global]")
for key, value in keep.items():
    print(f"{key} = {value}")
EOF
}

# The first Debian mirror apt uses here, from either format (deb822 .sources, one-line .list), or
# nothing: a machine may have either, both or none of them.
mirror() {
    python3 - <<'EOF'
import glob
found = []
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    found += [w for line in open(path) if line.startswith("URIs:") for w in line.split()[1:]]
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    found += [w for line in lines if line.startswith("deb ") for w in line.split()[1:] if "://" in w][:1]
print(next((uri for uri in found if "security" not in uri), ""))
EOF
}

if ! "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1 && ! "$DOCKER" pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    MIRROR=$(mirror)
    [[ -n $MIRROR ]] || MIRROR=http://deb.debian.org/debian
    ROOTFS=$WORK/rootfs
    say "no $BASE_IMAGE from the registry: making it with debootstrap from $MIRROR"
    rm -rf "$ROOTFS"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || fail "debootstrap failed; see $WORK/debootstrap.log"
    # pip inside the build reaches the package index the way it does here.
    CA=$(python3 -c "import ssl; print(ssl.get_default_verify_paths().cafile or '')")
    for bundle in "$CA" /etc/ssl/certs/ca-certificates.crt ${PIP_CERT:-} ${REQUESTS_CA_BUNDLE:-}; do
        [[ -n $bundle && -f $bundle ]] || continue
        mkdir -p "$ROOTFS$(dirname "$bundle")" && cp -L "$bundle" "$ROOTFS$bundle"
    done
    pip_settings >"$ROOTFS/etc/pip.conf"
    # Debian's python refuses system-wide pip installs (PEP 668); the image only uses venvs.
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
    tar -C "$ROOTFS" -c . | "$DOCKER" import -c 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$ROOTFS"
fi

# --- 3. the image -----------------------------------------------------------------------------
say "building $IMAGE (log: $WORK/build.log)"
started=$(now)
if ! DOCKER_BUILDKIT=1 "$DOCKER" build --progress plain --network host -t "$IMAGE" . >"$WORK/build.log" 2>&1; then
    tail -n 40 "$WORK/build.log" >&2
    fail "docker build failed; see $WORK/build.log"
fi
BUILD_S=$(since "$started")
SIZE=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}')

# --- 4. runs ----------------------------------------------------------------------------------
cleanup() { "$DOCKER" rm -f "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT

# One chat request through the published port; prints the answer.
chat() {
    python3 - "$PORT" <<'EOF'
import json, sys, urllib.request
body = {"model": "default", "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]}
request = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions", json.dumps(body).encode(),
    {"Content-Type": "application/json"},
)
with urllib.request.urlopen(request, timeout=120) as response:
    reply = json.load(response)
# The bundled model is a smoke-test model: what it says may be empty once its end marker is cut,
# but it must have generated.
assert reply["usage"]["completion_tokens"] > 0, f"no tokens generated: {reply}"
answer = reply["choices"][0]["message"]["content"] or ""
print(answer.strip().replace("\n", " ")[:60] or f"(empty text, {reply['usage']['completion_tokens']} tokens)")
EOF
}

# Run the image with "$@" and check everything the README promises; sets READY_S and STOP_S.
check_run() {
    local what=$1; shift
    cleanup
    "$DOCKER" run -d --name "$NAME" -p "127.0.0.1:$PORT:8787" "$@" >/dev/null
    local started ready=no; started=$(now)
    for _ in $(seq 600); do
        if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/ready', timeout=2)" \
            2>/dev/null; then ready=yes; break; fi
        [[ $("$DOCKER" inspect -f '{{.State.Running}}' "$NAME") == true ]] || { "$DOCKER" logs "$NAME" >&2; fail "$what: exited"; }
        sleep 0.5
    done
    [[ $ready == yes ]] || { "$DOCKER" logs "$NAME" 2>&1 | tail -n 20 >&2; fail "$what: not ready within 300s"; }
    READY_S=$(since "$started")
    local answer; answer=$(chat) || { "$DOCKER" logs "$NAME" 2>&1 | tail -n 20 >&2; fail "$what: no chat answer"; }
    local uid; uid=$("$DOCKER" exec "$NAME" id -u)
    [[ $uid != 0 ]] || fail "$what: runs as root"
    local health=starting
    for _ in $(seq 120); do
        health=$("$DOCKER" inspect -f '{{.State.Health.Status}}' "$NAME")
        [[ $health == starting ]] || break
        sleep 1
    done
    [[ $health == healthy ]] || fail "$what: health is $health"
    started=$(now)
    "$DOCKER" stop -t "$GRACE" "$NAME" >/dev/null
    STOP_S=$(since "$started")
    local code; code=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$NAME")
    [[ $code != 137 ]] || fail "$what: killed after the ${GRACE}s grace period instead of stopping"
    say "$what: ready in ${READY_S}s, answer \"$answer\", uid $uid, $health, stopped in ${STOP_S}s (exit $code)"
}

check_run "bundled model" "$IMAGE"
BUNDLED_READY=$READY_S BUNDLED_STOP=$STOP_S

# The bundled model, copied out of the image, as a user's mounted model.
MODELS=$WORK/models
rm -rf "$MODELS" && mkdir -p "$MODELS"
cleanup
"$DOCKER" create --name "$NAME" "$IMAGE" >/dev/null
MODEL_IN_IMAGE=$("$DOCKER" run --rm --entrypoint sh "$IMAGE" -c 'ls /opt/toolpair/cache/models/*.gguf' | head -n1)
"$DOCKER" cp "$NAME:$MODEL_IN_IMAGE" "$MODELS/model.gguf"
chmod 0644 "$MODELS/model.gguf"
check_run "mounted model" -v "$MODELS:/models:ro" "$IMAGE" --model /models/model.gguf
MOUNTED_READY=$READY_S MOUNTED_STOP=$STOP_S

# A model the container's user cannot read: one clear line, no traceback.
chmod 0600 "$MODELS/model.gguf"
cleanup
CODE=0
LOG=$(timeout 120 "$DOCKER" run --name "$NAME" -v "$MODELS:/models:ro" "$IMAGE" --model /models/model.gguf 2>&1) \
    || CODE=$?
[[ $CODE != 0 ]] || fail "an unreadable model did not fail"
grep -q Traceback <<<"$LOG" && { echo "$LOG" >&2; fail "an unreadable model gave a traceback"; }
LINE=$(grep -F /models/model.gguf <<<"$LOG") || { echo "$LOG" >&2; fail "the error does not name the model file"; }
say "unreadable model: exit $CODE, $(wc -l <<<"$LOG") line(s): $LINE"

# --- 5. the image's engine on an older CPU -------------------------------------------------------
OLD_CPU=${DOCKER_CHECK_OLD_CPU:-Haswell}
started=$(now)
EMULATED=$("$DOCKER" run --rm -v "$(command -v qemu-x86_64-static):/usr/local/bin/qemu-x86_64:ro" \
    --entrypoint /usr/local/bin/qemu-x86_64 "$IMAGE" -cpu "$OLD_CPU" /opt/toolpair/venv/bin/python \
    -m engine_launcher.inside.speed "$MODEL_IN_IMAGE" --prompt-tokens 8 --gen-tokens 4 --repeats 1 2>&1) \
    || { echo "$EMULATED" | tail -n 20 >&2; fail "the image's engine did not run on an emulated $OLD_CPU"; }
say "the image's engine on an emulated $OLD_CPU: generated in $(since "$started")s: $(tail -n1 <<<"$EMULATED")"

say "figures: build ${BUILD_S}s, image $SIZE, /ready ${BUNDLED_READY}s (bundled) ${MOUNTED_READY}s (mounted), \
docker stop ${BUNDLED_STOP}s / ${MOUNTED_STOP}s"
say "docker check passed"
