#!/usr/bin/env bash
# Two toolpair replicas behind nginx (config/deploy/nginx.conf) with a shared Redis store, on
# loopback and without Docker, under a bounded load of multi-turn Responses and Chat
# conversations; one replica is killed mid-load. Prints the figures; exit 0 when every target
# is met. Needs nginx and redis-server (`make scale-check` installs them) and the venv.
#
#   scripts/scale_check.sh [--conversations 48] [--turns 6] [--report FILE] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PY" ]; then
    echo "scale_check: $PY not found; run 'make .venv/.deps-test' first (or set PYTHON)" >&2
    exit 2
fi
exec "$PY" bench/replicas.py "$@"
