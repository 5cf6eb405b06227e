#!/usr/bin/env bash
# Continuous (iteration-level) vs static (request-level) batching on our own server,
# measured from the client side by `orchestrator bench` with one workload file.
#
# Starts `orchestrator serve` on the default model twice: with the serve config as is
# (continuous), then with a temporary copy that differs only in `scheduler.batching:
# static`. Both servers get exactly the same requests at the same send times (the
# second run replays the first run's workload.jsonl with the same seed). Prints the two
# runs side by side with ratios continuous/static, and as its last line:
#   served continuous/static: throughput <X>x, p99 TTFT <Y>x
#
# Settings (environment): CONFIG, PORT, NUM_REQUESTS, RATE, INPUT_LEN, OUTPUT_LEN,
# SEED, SLO_TTFT_MS, SLO_TPOT_MS, OUT (results folder), READY_TIMEOUT_S, ORCHESTRATOR
# (the CLI to run), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

ORCH=${ORCHESTRATOR:-.venv/bin/orchestrator}
PY=${PYTHON:-.venv/bin/python}
CONFIG=${CONFIG:-configs/serve/smollm2-cpu.yaml}
PORT=${PORT:-8123}
NUM_REQUESTS=${NUM_REQUESTS:-48}
# Above what two CPU cores serve, so that throughput measures capacity, not the offered load.
RATE=${RATE:-8}
INPUT_LEN=${INPUT_LEN:-uniform:32:128}
OUTPUT_LEN=${OUTPUT_LEN:-lognormal:32:0.6:96}
SEED=${SEED:-0}
# Two CPU cores serve slowly; these bounds suit them, not a GPU.
SLO_TTFT_MS=${SLO_TTFT_MS:-3000}
SLO_TPOT_MS=${SLO_TPOT_MS:-300}
OUT=${OUT:-out/serve_continuous_vs_static}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-300}

die() {
    echo "serve_continuous_vs_static: $*" >&2
    exit 2
}

[[ -f $CONFIG ]] || die "$CONFIG not found: this benchmark needs the gateway's serve config"
"$ORCH" serve --help >/dev/null 2>&1 ||
    die "'$ORCH serve' is not available: this benchmark needs the gateway (orchestrator serve)"
"$ORCH" bench --help >/dev/null 2>&1 || die "'$ORCH bench' is not available"
# shellcheck source=benchmarks/lib/serving.sh
source benchmarks/lib/serving.sh
require_free_port

rm -rf "$OUT"
mkdir -p "$OUT"
STATIC_CONFIG="$OUT/serve-static.yaml"
edit_config "$CONFIG" "$STATIC_CONFIG" 'config.setdefault("scheduler", {})["batching"] = "static"'

start_server() { # CONFIG LOG
    launch_server "$2" "$ORCH" serve --config "$1" --host 127.0.0.1 --port "$PORT"
}

bench() { # LABEL ARGS...
    local label=$1
    shift
    echo "== $label: $NUM_REQUESTS requests, poisson $RATE req/s" >&2
    "$ORCH" bench --url "http://127.0.0.1:$PORT" --label "$label" \
        --result-dir "$OUT/$label" --load poisson --rate "$RATE" --seed "$SEED" \
        --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" --no-progress "$@"
}

start_server "$CONFIG" "$OUT/serve-continuous.log"
bench continuous --num-requests "$NUM_REQUESTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
stop_server

start_server "$STATIC_CONFIG" "$OUT/serve-static.log"
bench static --workload "$OUT/continuous/workload.jsonl"
stop_server

"$ORCH" bench --compare "$OUT/static/summary.json" "$OUT/continuous/summary.json"
"$PY" - "$OUT/continuous/summary.json" "$OUT/static/summary.json" <<'PY'
import json
import sys


def summary(path: str) -> dict:
    with open(path) as f:
        return json.load(f)["runs"][0]["summary"]


def ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "n/a"
    r = a / b
    return f"{r:.2f}x" if r >= 0.1 or r == 0 else f"{r:.2g}x"


cont, static = summary(sys.argv[1]), summary(sys.argv[2])
throughput = ratio(cont["output_throughput_tok_s"], static["output_throughput_tok_s"])
ttft = ratio(cont["ttft_s"]["p99"], static["ttft_s"]["p99"])
print(f"served continuous/static: throughput {throughput}, p99 TTFT {ttft}")
PY
