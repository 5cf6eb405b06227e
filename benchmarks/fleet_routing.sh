#!/usr/bin/env bash
# Dynamo's KV router against its round-robin router in front of two of our workers
# (`orchestrator dynamo-worker`, the default model on CPU from configs/serve/smollm2-cpu.yaml
# with a small KV pool), on a multi-tenant shared-prefix workload, in the same run.
#
# One frontend per mode shares the two workers: round-robin, and the KV router at each
# prefix-overlap credit of KV_OVERLAP_CREDITS (--router-kv-overlap-score-credit: 1 is
# Dynamo's default; Dynamo's tuning guide raises it where TTFT matters more than
# inter-token latency, as on this prefix-heavy workload). Rounds alternate the order of
# the modes, so background load on the machine falls on all of them. Workload per mode per
# round: TENANTS tenants, each with its own system prompt (PREFIX_WORDS words, about
# 300 tokens) and a short unique question, Poisson arrivals at RATE req/s, REQUESTS
# requests, OUTPUT_LEN output tokens with EOS ignored. Each worker's KV pool is
# NUM_BLOCKS blocks of 16 tokens: two tenants' prefixes (about 20 blocks each) plus a
# few running requests' own blocks, so all tenants' prefixes fit the fleet's cache but
# only half of them fit one worker's (with the default 0.5 GiB pool every prefix fits
# every worker and the router could not matter).
#
# Prints per mode (medians over rounds): prefix hit rate from the workers' own counters
# (and as the clients saw it in usage.prompt_tokens_details.cached_tokens), TTFT p50/p99,
# TPOT p50, output tok/s, goodput under the interactive targets of
# configs/serve/smollm2-cpu-slo.yaml; then each kv mode's ratios to round-robin with PASS/MISS
# against the plan's target (hit rate >= 1.5x, TTFT p50 lower), and the simulator's
# routers' predicted hit rates for the same prompts beside the measured ones.
#
# Everything runs inside a private network namespace (`unshare --net`, loopback up): a
# worker with KV routing opens ZMQ sockets on 0.0.0.0 whatever DYN_EVENT_PLANE_HOST says.
# Needs root (or user namespaces), `make install`'s .venv and .venv-dynamo.
#
# Settings (environment): ROUNDS (2), REQUESTS (48), RATE (1.0), TENANTS (4),
# PREFIX_WORDS (240), OUTPUT_LEN (32), NUM_BLOCKS (48), NUM_THREADS (1 per worker),
# KV_OVERLAP_CREDITS ("1 2"),
# OUT (results folder), TIMEOUT_S (the whole run's bound, default 1800).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PY=${PYTHON:-$ROOT/.venv/bin/python}
ROUNDS=${ROUNDS:-2}
REQUESTS=${REQUESTS:-48}
RATE=${RATE:-1.0}
TENANTS=${TENANTS:-4}
PREFIX_WORDS=${PREFIX_WORDS:-240}
OUTPUT_LEN=${OUTPUT_LEN:-32}
NUM_BLOCKS=${NUM_BLOCKS:-48}
NUM_THREADS=${NUM_THREADS:-1}
KV_OVERLAP_CREDITS=${KV_OVERLAP_CREDITS:-1 2}
OUT=${OUT:-$ROOT/out/fleet_routing}
TIMEOUT_S=${TIMEOUT_S:-1800}

die() {
    echo "fleet_routing: $*" >&2
    exit 2
}

[[ -x $PY ]] || die "$PY is missing: run make install"
[[ -x .venv-dynamo/bin/orchestrator ]] || die ".venv-dynamo is missing: run make install"
command -v unshare >/dev/null && command -v ip >/dev/null ||
    die "unshare or ip (util-linux, iproute2) is missing: no private network namespace"
unshare --net ip link set lo up 2>/dev/null || die "a private network namespace is refused here"

rm -rf "$OUT"
mkdir -p "$OUT"

# A session of its own, so one signal at exit reaches every process of the run.
setsid timeout --signal=TERM --kill-after=30 "$TIMEOUT_S" \
    unshare --net sh -c 'ip link set lo up && exec "$@"' sh \
    "$PY" benchmarks/fleet_routing.py --out "$OUT" --rounds "$ROUNDS" --requests "$REQUESTS" \
    --rate "$RATE" --tenants "$TENANTS" --prefix-words "$PREFIX_WORDS" \
    --output-len "$OUTPUT_LEN" --num-blocks "$NUM_BLOCKS" --num-threads "$NUM_THREADS" \
    --kv-overlap-credits $KV_OVERLAP_CREDITS \
    > >(tee "$OUT/report.txt") 2> >(tee "$OUT/driver.log" >&2) &
RUN_PID=$!

cleanup() {
    kill -TERM -- "-$RUN_PID" 2>/dev/null || true
    sleep 1
    kill -KILL -- "-$RUN_PID" 2>/dev/null || true
}
trap cleanup EXIT

wait "$RUN_PID" || die "the run failed (exit $?); logs in $OUT"
