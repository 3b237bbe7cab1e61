#!/usr/bin/env bash
# Live check that the README's agent clients work on `toolpair serve`'s defaults.
#
# Installs the real Claude Code and Codex CLIs from npm into a local prefix (not
# global), starts `toolpair serve` with no settings at all (the bundled model),
# runs one non-interactive turn of each, and reports pass or fail with timings.
# A turn passes when the CLI exits 0 and reports no API error and no "prompt is
# too long"; what the tiny model says does not matter. Exit status: 0 when both
# pass.
#
#   scripts/agent_clients_check.sh            # needs `make .venv/.deps-serve` and `toolpair engine install`
#   CLI_PREFIX=/opt/agents TURN_TIMEOUT=1800 scripts/agent_clients_check.sh
#   EXTRA_SERVE_ARGS="--parallel 2" scripts/agent_clients_check.sh
#   CLIENTS=codex scripts/agent_clients_check.sh     # one of them only
#
# The same clients through `toolpair proxy` (the sidecar, no flags) in front of an engine instead:
#   UPSTREAM=llama-server scripts/agent_clients_check.sh   # llama.cpp's llama-server (scripts/build_llama_server.sh),
#                                                          # serve's default model (ENGINE_MODEL=PATH for
#                                                          # another), --jinja, LLAMA_CTX (default 32768)
#   UPSTREAM=llama-router scripts/agent_clients_check.sh   # llama-server's router: --models-dir with that
#                                                          # model under two names (ROUTER_MODELS), the first
#                                                          # loaded through the router's /models/load (ROUTER_LOAD;
#                                                          # "none" loads nothing: give a map in EXTRA_SERVE_ARGS)
#   UPSTREAM=llama-router ROUTER_LOAD=none \
#     EXTRA_SERVE_ARGS="--model-map claude-*=gemma-a --model-map local-model=gemma-b" scripts/agent_clients_check.sh
#   UPSTREAM=http://127.0.0.1:8080 scripts/agent_clients_check.sh   # an engine already running there
#   LLAMA_ARGS="-n 128" UPSTREAM=llama-server ...   # more llama-server arguments. -n caps only a request that
#                                                   # names no max_tokens: Codex's, not Claude Code's (it asks for
#                                                   # 32000, and takes a reply cut at its own cap as an API error)
#   REPLY="Hello." UPSTREAM=llama-server ...        # llama-server writes exactly this (a GBNF grammar) and ends
#                                                   # its turn. The default for llama-server and llama-router:
#                                                   # on Claude Code's 13k-token prompt SmolLM2-135M wrote over
#                                                   # 1,250 tokens without ending its turn. REPLY= (empty) lets
#                                                   # the model write freely.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLPAIR="${TOOLPAIR:-$ROOT/.venv/bin/toolpair}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
CLI_PREFIX="${CLI_PREFIX:-${TOOLPAIR_CACHE:-$HOME/.cache/toolpair}/agent-clients}"
TURN_TIMEOUT="${TURN_TIMEOUT:-1200}"    # seconds per CLI turn: a 13k-token prompt takes minutes on a small CPU
READY_TIMEOUT="${READY_TIMEOUT:-600}"
PROMPT="${PROMPT:-Say hello in one short sentence.}"
CLIENTS="${CLIENTS:-claude codex}"

UPSTREAM="${UPSTREAM:-}"                # empty: toolpair serve; llama-server, llama-router or a URL: toolpair proxy
ROUTER_MODELS="${ROUTER_MODELS:-gemma-a gemma-b}"
ROUTER_LOAD="${ROUTER_LOAD:-${ROUTER_MODELS%% *}}"
REPLY="${REPLY-Hello from llama-server, through toolpair.}"

WORK="$(mktemp -d -t toolpair-agents-XXXXXX)"
SERVE_PID=""
ENGINE_PID=""
cleanup() {
    for pid in "$SERVE_PID" "$ENGINE_PID"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
        fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# --- 1. the CLIs, from npm, into a local prefix --------------------------------------------
CLAUDE="$CLI_PREFIX/node_modules/.bin/claude"
CODEX="$CLI_PREFIX/node_modules/.bin/codex"
if [ ! -x "$CLAUDE" ] || [ ! -x "$CODEX" ] || [ -n "${UPDATE_CLIS:-}" ]; then
    echo "installing @anthropic-ai/claude-code and @openai/codex into $CLI_PREFIX"
    mkdir -p "$CLI_PREFIX"
    npm install --prefix "$CLI_PREFIX" --no-audit --no-fund --loglevel=error \
        @anthropic-ai/claude-code @openai/codex || { echo "FAIL: npm install"; exit 1; }
fi
echo "claude $("$CLAUDE" --version 2>/dev/null | head -1); codex $("$CODEX" --version 2>/dev/null | head -1)"

# --- 2. toolpair serve on its defaults, or toolpair proxy in front of an engine -------------
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT="$(free_port)"
URL="http://127.0.0.1:$PORT"
started="$(now)"
if [ "$UPSTREAM" = llama-server ] || [ "$UPSTREAM" = llama-router ]; then
    LLAMA_SERVER="$(PYTHON="$PYTHON" "$ROOT/scripts/build_llama_server.sh")" || { echo "FAIL: llama-server build"; exit 1; }
    # serve's default model (SmolLM2-135M-Instruct); ENGINE_MODEL=PATH for another GGUF
    MODEL="${ENGINE_MODEL:-$("$PYTHON" -c 'from engine_launcher.builder.models import default_model; print(default_model())')}"
    ENGINE_PORT="$(free_port)"
    if [ "$UPSTREAM" = llama-router ]; then
        mkdir -p "$WORK/models"
        for name in $ROUTER_MODELS; do ln -s "$MODEL" "$WORK/models/$name.gguf"; done
        WHAT_MODEL=(--models-dir "$WORK/models")
    else
        WHAT_MODEL=(-m "$MODEL")
    fi
    GRAMMAR=()
    # A grammar that admits one exact text: the engine writes it and stops (quotes and backslashes escaped for GBNF).
    [ -n "$REPLY" ] && GRAMMAR=(--grammar "root ::= \"$(printf '%s' "$REPLY" | sed 's/[\\"]/\\&/g')\"")
    # shellcheck disable=SC2086  # LLAMA_ARGS is a list of words on purpose
    "$LLAMA_SERVER" "${WHAT_MODEL[@]}" --jinja --host 127.0.0.1 --port "$ENGINE_PORT" -c "${LLAMA_CTX:-32768}" \
        "${GRAMMAR[@]}" ${LLAMA_ARGS:-} >"$WORK/engine.out" 2>"$WORK/engine.err" &
    ENGINE_PID=$!
    UPSTREAM="http://127.0.0.1:$ENGINE_PORT"
    until curl -sf "$UPSTREAM/health" >/dev/null; do
        if ! kill -0 "$ENGINE_PID" 2>/dev/null || [ "$(since "$started" | cut -d. -f1)" -ge "$READY_TIMEOUT" ]; then
            echo "FAIL: llama-server did not become ready"; tail -30 "$WORK/engine.err"; exit 1
        fi
        sleep 0.5
    done
    echo "llama-server ready on $UPSTREAM in $(since "$started")s${REPLY:+; it writes exactly: $REPLY}"
    if [ "${WHAT_MODEL[0]}" = --models-dir ] && [ "$ROUTER_LOAD" != none ]; then
        curl -sf -X POST -H 'Content-Type: application/json' -d "{\"model\": \"$ROUTER_LOAD\"}" \
            "$UPSTREAM/models/load" >/dev/null || { echo "FAIL: the router did not load $ROUTER_LOAD"; exit 1; }
        until curl -sf "$UPSTREAM/v1/models" | "$PYTHON" -c 'import json, sys
sys.exit(not any(m["id"] == sys.argv[1] and m["status"]["value"] == "loaded" for m in json.load(sys.stdin)["data"]))' \
            "$ROUTER_LOAD"; do
            if [ "$(since "$started" | cut -d. -f1)" -ge "$READY_TIMEOUT" ]; then echo "FAIL: $ROUTER_LOAD not loaded"; exit 1; fi
            sleep 0.5
        done
        echo "the router loaded $ROUTER_LOAD in $(since "$started")s"
    fi
    [ "${WHAT_MODEL[0]}" = --models-dir ] && echo "router models: $(curl -sf "$UPSTREAM/v1/models" | "$PYTHON" -c \
        'import json, sys; print(", ".join(m["id"] + ": " + m["status"]["value"] for m in json.load(sys.stdin)["data"]))')"
fi
if [ -n "$UPSTREAM" ]; then
    # shellcheck disable=SC2086  # EXTRA_SERVE_ARGS is a list of words on purpose
    "$TOOLPAIR" proxy --upstream "$UPSTREAM" --port "$PORT" ${EXTRA_SERVE_ARGS:-} >"$WORK/serve.out" 2>"$WORK/serve.err" &
    what="toolpair proxy"
else
    # shellcheck disable=SC2086
    "$TOOLPAIR" serve --port "$PORT" ${EXTRA_SERVE_ARGS:-} >"$WORK/serve.out" 2>"$WORK/serve.err" &
    what="toolpair serve"
fi
SERVE_PID=$!
until curl -sf "$URL/ready" >/dev/null; do
    if ! kill -0 "$SERVE_PID" 2>/dev/null || [ "$(since "$started" | cut -d. -f1)" -ge "$READY_TIMEOUT" ]; then
        echo "FAIL: $what did not become ready"; tail -30 "$WORK/serve.err"; exit 1
    fi
    sleep 0.5
done
echo "$what ready in $(since "$started")s:"
sed 's/^/  | /' "$WORK/serve.out"
[ -n "$UPSTREAM" ] && sed 's/^/  | /' "$WORK/serve.err" | grep -v ' INFO toolpair.access' | head -16

failures=0
report() { # name, start, pass|fail, detail
    printf '%-12s %-4s %7ss  %s\n' "$1" "$(echo "$3" | tr a-z A-Z)" "$(since "$2")" "$4"
    [ "$3" = pass ] || failures=$((failures + 1))
}
problem() { # the first API error or context overflow a CLI printed, if any
    grep -ioE '(prompt is too long|api error[^"]{0,160}|stream error[^"]{0,160}|unexpected status[^"]{0,160})' "$1" | head -1
}

# --- 3. Claude Code: one -p turn -----------------------------------------------------------
if [[ " $CLIENTS " == *" claude "* ]]; then
mkdir -p "$WORK/claude-project" "$WORK/claude-config"
t="$(now)"
(cd "$WORK/claude-project" && ANTHROPIC_BASE_URL="$URL" ANTHROPIC_API_KEY="sk-ant-local" DISABLE_TELEMETRY=1 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 CLAUDE_CONFIG_DIR="$WORK/claude-config" \
    API_TIMEOUT_MS="$((TURN_TIMEOUT * 1000))" CLAUDE_STREAM_IDLE_TIMEOUT_MS="$((TURN_TIMEOUT * 1000))" \
    timeout "$TURN_TIMEOUT" "$CLAUDE" -p "$PROMPT" --output-format json --max-turns 3 \
    </dev/null >"$WORK/claude.out" 2>"$WORK/claude.err")
code=$?
verdict="$("$PYTHON" - "$WORK/claude.out" <<'EOF'
import json, sys
try:
    result = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except (ValueError, IndexError) as exc:
    print(f"fail no JSON result ({exc})")
    raise SystemExit
text = str(result.get("result", ""))
bad = result.get("is_error") or "api error" in text.lower() or "prompt is too long" in text.lower()
turns = result.get("num_turns")
print(("fail" if bad else "pass"), f"{result.get('subtype')}, {turns} turn(s), said: {text[:100]!r}")
EOF
)"
found="$(problem "$WORK/claude.out"; problem "$WORK/claude.err")"
if [ "$code" -eq 0 ] && [ "${verdict%% *}" = pass ] && [ -z "$found" ]; then
    report "claude -p" "$t" pass "${verdict#* }"
else
    report "claude -p" "$t" fail "exit $code; ${verdict#* } ${found}"
    tail -5 "$WORK/claude.err"
fi
fi

# --- 4. Codex CLI: one exec turn -----------------------------------------------------------
if [[ " $CLIENTS " == *" codex "* ]]; then
mkdir -p "$WORK/codex-home" "$WORK/codex-project"
cat >"$WORK/codex-home/config.toml" <<EOF
model = "local-model"
model_provider = "toolpair"

[model_providers.toolpair]
name = "toolpair"
base_url = "$URL/v1"
wire_api = "responses"
env_key = "TOOLPAIR_KEY"
# A long prompt on a small CPU sends nothing for minutes before the first token.
stream_idle_timeout_ms = $((TURN_TIMEOUT * 1000))
stream_max_retries = 0
request_max_retries = 0
EOF
t="$(now)"
(cd "$WORK/codex-project" && CODEX_HOME="$WORK/codex-home" TOOLPAIR_KEY=local \
    timeout "$TURN_TIMEOUT" "$CODEX" exec --skip-git-repo-check -s danger-full-access "$PROMPT" \
    </dev/null >"$WORK/codex.out" 2>&1)
code=$?
found="$(problem "$WORK/codex.out")"
said="$(grep -v '^\s*$' "$WORK/codex.out" | tail -1 | cut -c1-100)"
if [ "$code" -eq 0 ] && [ -z "$found" ]; then
    report "codex exec" "$t" pass "said: '$said'"
else
    report "codex exec" "$t" fail "exit $code; $found"
    tail -15 "$WORK/codex.out"
fi
fi

echo "requests toolpair answered (route status time):"
grep 'toolpair.access' "$WORK/serve.err" | grep -v ' /ready ' | awk '{ print "  " $4, $5, $6, $7 }'
if [ -n "$UPSTREAM" ]; then
    echo "API routes toolpair chose (native or translated, and why):"
    curl -sf "$URL/toolpair/metrics" | grep '^toolpair_api_routes_total{' | sed 's/^toolpair_api_routes_total/  /'
fi
if grep -qiE 'traceback|error' "$WORK/serve.err"; then
    echo "toolpair logged errors:"; grep -iE 'traceback|error' "$WORK/serve.err" | head -5 | cut -c1-300
fi
[ "$failures" -eq 0 ] && echo "RESULT: every client ($CLIENTS) finished a turn" || echo "RESULT: $failures client(s) failed"
exit "$failures"
