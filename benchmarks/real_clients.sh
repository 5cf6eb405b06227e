#!/usr/bin/env bash
# GuideLLM and AIPerf, unmodified, against the real gateway.
#
# Installs each tool in a throwaway virtual environment under $WORK (default
# /tmp/orchestrator-real-clients; never inside .venv: GuideLLM brings its own multi-GB
# torch), starts `orchestrator serve` with `make serve`'s config on 127.0.0.1, runs each
# tool briefly on both endpoints (chat and completions, streaming), and checks from the
# server's own request log that every request the tools sent was answered 200 (the log
# has one line per request, rejections included). Prints per run
#   <tool> <endpoint>: <N> requests, <F> not 200
# and, last,
#   real clients: <total> requests, <failed> not 200
# and exits 1 if any request failed, a tool exited non-zero, or a tool sent nothing.
#
# Downloads a lot (each tool and its dependencies from PyPI); not part of `make test`.
# Settings (environment): CONFIG, PORT, WORK, REQUESTS (per run), CONCURRENCY,
# GUIDELLM_VERSION, AIPERF_VERSION, PYTHON (to build the tool environments),
# ORCHESTRATOR (the CLI to run), READY_TIMEOUT_S.
set -euo pipefail
cd "$(dirname "$0")/.."

ORCH=${ORCHESTRATOR:-.venv/bin/orchestrator}
PROJECT_PY=.venv/bin/python
PY=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/serve/smollm2-cpu.yaml}
PORT=${PORT:-8124}
WORK=${WORK:-/tmp/orchestrator-real-clients}
REQUESTS=${REQUESTS:-8}
CONCURRENCY=${CONCURRENCY:-2}
GUIDELLM_VERSION=${GUIDELLM_VERSION:-0.8.1}
AIPERF_VERSION=${AIPERF_VERSION:-0.13.0}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-600}
BASE="http://127.0.0.1:$PORT"

die() {
    echo "real_clients: $*" >&2
    exit 2
}

[[ -f $CONFIG ]] || die "$CONFIG not found"
"$ORCH" serve --help >/dev/null 2>&1 || die "'$ORCH serve' is not available (run make install)"
"$PROJECT_PY" -c "import socket, sys; sys.exit(socket.socket().connect_ex(('127.0.0.1', $PORT)) == 0)" ||
    die "port $PORT is already in use; set PORT"
mkdir -p "$WORK"

# A tool environment per tool, kept between runs of this script (delete $WORK to redo).
tool_env() { # name, pip requirement
    local venv="$WORK/$1-venv"
    if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -m pip show "$1" >/dev/null 2>&1; then
        echo "installing $2 into $venv"
        "$PY" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet "$2"
    fi
    echo "$venv"
}

GUIDELLM_VENV=$(tool_env guidellm "guidellm==$GUIDELLM_VERSION" | tail -1)
AIPERF_VENV=$(tool_env aiperf "aiperf==$AIPERF_VERSION" | tail -1)

# Both tools count tokens with the model's tokenizer; nothing may come from a hub, so
# they get the served model's own tokenizer as a local folder.
MODEL=$("$PROJECT_PY" - "$CONFIG" "$WORK/tokenizer" <<'PY'
import sys

from orchestrator.common.model_source import load_tokenizer
from orchestrator.core import load_engine_config

config = load_engine_config(sys.argv[1])
load_tokenizer(config.model).save_pretrained(sys.argv[2])
print(config.model.name)
PY
)

LOG="$WORK/server.log"
"$ORCH" serve --config "$CONFIG" --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
deadline=$((SECONDS + READY_TIMEOUT_S))
until curl -sf "$BASE/ready" >/dev/null; do
    kill -0 $SERVER 2>/dev/null || die "the server exited; see $LOG"
    ((SECONDS < deadline)) || die "the server was not ready after $READY_TIMEOUT_S s"
    sleep 1
done

TOTAL=0
FAILED=0
STATUS=0

# Count the generation requests the server logged since byte $1 of its log, and those
# not answered 200. Prints "<N> <F>".
answered_since() {
    "$PROJECT_PY" - "$LOG" "$1" <<'PY'
import json
import sys

path, offset = sys.argv[1], int(sys.argv[2])
with open(path, "rb") as f:
    f.seek(offset)
    lines = f.read().decode(errors="replace").splitlines()
entries = []
for line in lines:
    if "orchestrator.gateway.requests" not in line:
        continue
    entry = json.loads(line.split(": ", 1)[1])
    if entry.get("path", "").startswith("/v1/") and entry.get("path") != "/v1/models":
        entries.append(entry)
failed = [e for e in entries if e["status"] != 200]
for e in failed[:5]:
    print(f"  not 200: {e}", file=sys.stderr)
print(len(entries), len(failed))
PY
}

run() { # label, command...
    local label=$1
    shift
    local offset
    offset=$(stat -c %s "$LOG")
    echo "== $label"
    if ! "$@" >"$WORK/$label.out" 2>&1; then
        echo "  $label exited non-zero; last lines:" >&2
        tail -20 "$WORK/$label.out" >&2
        STATUS=1
    fi
    read -r n f < <(answered_since "$offset")
    echo "$label: $n requests, $f not 200"
    ((n > 0)) || STATUS=1
    ((f == 0)) || STATUS=1
    TOTAL=$((TOTAL + n))
    FAILED=$((FAILED + f))
}

# GuideLLM 0.8's options take `kind=...,key=value` specs.
guidellm_run() { # request format
    "$GUIDELLM_VENV/bin/guidellm" run \
        --backend "kind=openai_http,target=$BASE,model=$MODEL,request_format=$1" \
        --tokenizer "kind=hf_auto,model=$WORK/tokenizer" \
        --data "kind=synthetic_text,prompt_tokens=64,output_tokens=16" \
        --profile "kind=concurrent,streams=$CONCURRENCY" \
        --constraint "kind=max_requests,count=$REQUESTS" \
        --output "kind=json,path=$WORK/guidellm${1//\//-}.json" \
        --disable-console-interactive
}
run guidellm-chat guidellm_run /v1/chat/completions
run guidellm-completions guidellm_run /v1/completions

AIPERF=("$AIPERF_VENV/bin/aiperf" profile --model "$MODEL" --url "$BASE"
    --tokenizer "$WORK/tokenizer" --streaming --request-count "$REQUESTS"
    --concurrency "$CONCURRENCY" --synthetic-input-tokens-mean 64
    --synthetic-input-tokens-stddev 0 --output-tokens-mean 16 --output-tokens-stddev 0
    --extra-inputs ignore_eos:true --ui none)
run aiperf-chat "${AIPERF[@]}" --endpoint-type chat --artifact-dir "$WORK/aiperf-chat"
run aiperf-completions "${AIPERF[@]}" --endpoint-type completions \
    --artifact-dir "$WORK/aiperf-completions"

echo "real clients: $TOTAL requests, $FAILED not 200"
exit $STATUS
