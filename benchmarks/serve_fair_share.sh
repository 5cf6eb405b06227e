#!/usr/bin/env bash
# Tenant fair share through the real gateway and the CPU model: does a light tenant keep
# its SLO next to a heavy one? The served twin of benchmarks/fair_share.py.
#
# Configs come from CONFIG (configs/serve/smollm2-cpu-slo.yaml, for its SLO classes) with
# `policy: fcfs` and queue limits only (no SLO admission, no SLO budget), fair share off
# ("fcfs") or on ("fair"). Tenants are API keys (`--api-key light` / `heavy`: with auth
# off the bearer key still names the tenant), each an `orchestrator bench` process.
#
# 1. On the fcfs server: capacity, completed requests/s of a closed loop of CONCURRENCY
#    (64) clients; then the light tenant alone at 1/(1 + HEAVY_RATIO) of LOAD (1.3) x
#    capacity for DURATION_S seconds of arrivals; then both tenants at once, heavy at
#    HEAVY_RATIO (10) x light's rate (light replays its own requests).
# 2. On the fair server: both tenants again, the same two workloads.
# A light request counts as attained when its TTFT <= SLO_TTFT_MS and TPOT <=
# SLO_TPOT_MS. Last line (target: Q within 10 points of P):
#   served fair share: light tenant attainment <P>% alone, <Q>% with heavy tenant (fcfs: <R>%)
#
# Settings (environment): CONFIG, PORT, CONCURRENCY, CAPACITY_REQUESTS, DURATION_S,
# LOAD, HEAVY_RATIO, INPUT_LEN, OUTPUT_LEN, SEED, SLO_TTFT_MS, SLO_TPOT_MS, OUT,
# READY_TIMEOUT_S, ORCHESTRATOR, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

ORCH=${ORCHESTRATOR:-.venv/bin/orchestrator}
PY=${PYTHON:-.venv/bin/python}
CONFIG=${CONFIG:-configs/serve/smollm2-cpu-slo.yaml}
PORT=${PORT:-8125}
CONCURRENCY=${CONCURRENCY:-64}
CAPACITY_REQUESTS=${CAPACITY_REQUESTS:-256}
DURATION_S=${DURATION_S:-60}
LOAD=${LOAD:-1.3}
HEAVY_RATIO=${HEAVY_RATIO:-10}
INPUT_LEN=${INPUT_LEN:-uniform:32:128}
OUTPUT_LEN=${OUTPUT_LEN:-uniform:16:48}
SEED=${SEED:-0}
SLO_TTFT_MS=${SLO_TTFT_MS:-3000}
SLO_TPOT_MS=${SLO_TPOT_MS:-1000}
OUT=${OUT:-out/serve_fair_share}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-300}

die() {
    echo "serve_fair_share: $*" >&2
    exit 2
}

[[ -f $CONFIG ]] || die "$CONFIG not found"
"$ORCH" bench --help >/dev/null 2>&1 || die "'$ORCH bench' is not available"
# shellcheck source=benchmarks/lib/serving.sh
source benchmarks/lib/serving.sh
require_free_port

rm -rf "$OUT"
mkdir -p "$OUT"
for side in fcfs fair; do
    edit_config "$CONFIG" "$OUT/serve-$side.yaml" "
sched = config['scheduler']
sched['policy'] = 'fcfs'
for key in ('admission', 'slo_budget'):
    sched.pop(key, None)
sched['fair_share'] = {'enabled': '$side' == 'fair'}"
done

start_server() { # SIDE
    launch_server "$OUT/serve-$1.log" "$ORCH" serve --config "$OUT/serve-$1.yaml" \
        --host 127.0.0.1 --port "$PORT"
}

bench() { # LABEL TENANT ARGS...
    local label=$1 tenant=$2
    shift 2
    "$ORCH" bench --url "http://127.0.0.1:$PORT" --label "$label" --result-dir "$OUT/$label" \
        --api-key "$tenant" --seed "$SEED" --slo-ttft-ms "$SLO_TTFT_MS" \
        --slo-tpot-ms "$SLO_TPOT_MS" --no-progress "$@" >"$OUT/$label.txt" 2>&1 ||
        die "bench $label failed; see $OUT/$label.txt"
}

both() { # SIDE: the two tenants at once
    local light=(--workload "$OUT/light-alone/workload.jsonl")
    local heavy=(--num-requests "$HEAVY_REQUESTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN")
    if [[ -f $OUT/heavy-fcfs/workload.jsonl ]]; then
        heavy=(--workload "$OUT/heavy-fcfs/workload.jsonl")
    fi
    bench "light-$1" light --load poisson --rate "$LIGHT_RATE" "${light[@]}" &
    local light_pid=$!
    SEED=$((SEED + 1)) bench "heavy-$1" heavy --load poisson --rate "$HEAVY_RATE" "${heavy[@]}"
    wait "$light_pid"
}

start_server fcfs
echo "== capacity: closed loop of $CONCURRENCY clients" >&2
bench capacity capacity --load concurrency --concurrency "$CONCURRENCY" \
    --num-requests "$CAPACITY_REQUESTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
CAPACITY=$(summary_field "$OUT/capacity/summary.json" request_throughput_req_s)
read -r LIGHT_RATE HEAVY_RATE LIGHT_REQUESTS HEAVY_REQUESTS < <("$PY" -c "
import math
total = $CAPACITY * $LOAD
light = total / (1 + $HEAVY_RATIO)
heavy = total - light
print(round(light, 3), round(heavy, 3), math.ceil(light * $DURATION_S), math.ceil(heavy * $DURATION_S))")
echo "== capacity $CAPACITY req/s; light $LIGHT_RATE req/s, heavy $HEAVY_RATE req/s" >&2
echo "== light alone" >&2
bench light-alone light --load poisson --rate "$LIGHT_RATE" --num-requests "$LIGHT_REQUESTS" \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
echo "== both, fcfs" >&2
both fcfs
stop_server
echo "== both, fair share" >&2
start_server fair
both fair
stop_server

"$PY" - "$OUT" <<'PY'
import json
import sys

out = sys.argv[1]


def attained(label: str) -> float:
    with open(f"{out}/{label}/summary.json") as f:
        return json.load(f)["runs"][0]["summary"]["goodput_fraction"]


for side in ("fcfs", "fair"):
    print(f"{side:>5}: light {attained(f'light-{side}'):.1%}, heavy {attained(f'heavy-{side}'):.1%} within SLO")
alone, fair, fcfs = attained("light-alone"), attained("light-fair"), attained("light-fcfs")
print(
    f"served fair share: light tenant attainment {alone:.0%} alone, {fair:.0%} with heavy "
    f"tenant (fcfs: {fcfs:.0%})"
)
PY
