#!/usr/bin/env bash
# Goodput under overload through the real gateway and the CPU model: fcfs vs SLO-aware
# scheduling, measured from the client side by `orchestrator bench`, plus whether the
# Retry-After of SLO refusals can be honoured.
#
# 0. Serves CONFIG_SLO as it is: the engine fits its step-time prior at start on the
#    loaded executor (docs/slo.md), so nothing machine-specific is edited in.
# 1. Serves CONFIG_FCFS (CONFIG_SLO with `policy: fcfs`, queue limits only) and measures
#    its capacity: completed requests/s of a closed loop of CONCURRENCY clients (default
#    64, the batch cap, so the server is saturated), CAPACITY_REQUESTS requests.
# 2. Offers LOAD (1.5) x that capacity, Poisson, for DURATION_S seconds of arrivals, to
#    it, then the same requests (the saved workload.jsonl) to the SLO server.
# 3. Against a fresh SLO server, a client that honours Retry-After, on the same requests
#    and rate: each request refused with 429 checks that the header is there, waits that
#    long and retries once; the share of retries admitted is printed.
# 4. Reads the engine's median TTFT prediction error over the slo run from /metrics.
#
# The SLO judged is the interactive class's (SLO_TTFT_MS / SLO_TPOT_MS). Last line:
#   served slo/fcfs goodput at 1.5x capacity: <X>x; retry-after honoured: <Y>%
#
# Settings (environment): CONFIG_SLO, PORT, CAPACITY_REQUESTS, CONCURRENCY, DURATION_S,
# LOAD, INPUT_LEN, OUTPUT_LEN, SEED, SLO_TTFT_MS, SLO_TPOT_MS, OUT, READY_TIMEOUT_S, ORCHESTRATOR, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

ORCH=${ORCHESTRATOR:-.venv/bin/orchestrator}
PY=${PYTHON:-.venv/bin/python}
CONFIG_SLO=${CONFIG_SLO:-configs/serve/smollm2-cpu-slo.yaml}
PORT=${PORT:-8124}
CAPACITY_REQUESTS=${CAPACITY_REQUESTS:-256}
CONCURRENCY=${CONCURRENCY:-64}
DURATION_S=${DURATION_S:-60}
LOAD=${LOAD:-1.5}
INPUT_LEN=${INPUT_LEN:-uniform:32:128}
OUTPUT_LEN=${OUTPUT_LEN:-uniform:16:48}
SEED=${SEED:-0}
SLO_TTFT_MS=${SLO_TTFT_MS:-3000}
SLO_TPOT_MS=${SLO_TPOT_MS:-1000}
OUT=${OUT:-out/serve_goodput_under_overload}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-300}

die() {
    echo "serve_goodput_under_overload: $*" >&2
    exit 2
}

[[ -f $CONFIG_SLO ]] || die "$CONFIG_SLO not found"
"$ORCH" serve --help >/dev/null 2>&1 || die "'$ORCH serve' is not available"
"$ORCH" bench --help >/dev/null 2>&1 || die "'$ORCH bench' is not available"
# shellcheck source=benchmarks/lib/serving.sh
source benchmarks/lib/serving.sh
require_free_port

rm -rf "$OUT"
mkdir -p "$OUT"
CONFIG_SLO_RUN="$OUT/serve-slo.yaml"
cp "$CONFIG_SLO" "$CONFIG_SLO_RUN"
CONFIG_FCFS="$OUT/serve-fcfs.yaml"
# fcfs with today's defaults: queue limits, a fixed budget, no fair share.
edit_config "$CONFIG_SLO_RUN" "$CONFIG_FCFS" '
sched = config["scheduler"]
sched["policy"] = "fcfs"
for key in ("admission", "slo_budget", "fair_share"):
    sched.pop(key, None)'

start_server() { # CONFIG LOG
    launch_server "$2" "$ORCH" serve --config "$1" --host 127.0.0.1 --port "$PORT"
}

bench() { # LABEL ARGS...
    local label=$1
    shift
    "$ORCH" bench --url "http://127.0.0.1:$PORT" --label "$label" --result-dir "$OUT/$label" \
        --seed "$SEED" --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" \
        --no-progress "$@" >"$OUT/$label.txt"
}

start_server "$CONFIG_FCFS" "$OUT/serve-fcfs.log"
echo "== capacity: closed loop of $CONCURRENCY clients" >&2
bench capacity --load concurrency --concurrency "$CONCURRENCY" \
    --num-requests "$CAPACITY_REQUESTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
CAPACITY=$(summary_field "$OUT/capacity/summary.json" request_throughput_req_s)
RATE=$("$PY" -c "print(round($CAPACITY * $LOAD, 3))")
NUM_REQUESTS=$("$PY" -c "import math; print(math.ceil($RATE * $DURATION_S))")
echo "== capacity $CAPACITY req/s; offering $RATE req/s, $NUM_REQUESTS requests" >&2
bench fcfs --load poisson --rate "$RATE" --num-requests "$NUM_REQUESTS" \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
stop_server

start_server "$CONFIG_SLO_RUN" "$OUT/serve-slo.log"
bench slo --load poisson --rate "$RATE" --workload "$OUT/fcfs/workload.jsonl"
"$PY" - "$PORT" "$OUT/slo-metrics.json" <<'PY'
"""The engine's TTFT prediction error over the slo run, from /metrics."""
import json
import re
import sys

import httpx

port, out = int(sys.argv[1]), sys.argv[2]
metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
match = re.search(r"^orchestrator_ttft_prediction_error (\S+)$", metrics, re.M)
with open(out, "w") as f:
    json.dump({"ttft_prediction_error": float(match.group(1)) if match else None}, f)
PY
stop_server

# A fresh server (an empty prefix cache) for the retry client, on the same prompts.
start_server "$CONFIG_SLO_RUN" "$OUT/serve-slo-retries.log"
echo "== retry client at $RATE req/s" >&2
"$PY" - "$PORT" "$RATE" "$OUT/fcfs/workload.jsonl" "$SEED" "$OUT/retries.json" <<'PY'
"""Poisson arrivals of the workload's requests; a 429 must carry Retry-After; wait it
out and retry once."""
import asyncio
import json
import random
import sys

import httpx

port, rate, workload, seed, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
rng = random.Random(seed)
with open(workload) as f:
    requests = [json.loads(line) for line in f if line.strip()]
stats = {"requests": len(requests), "refused": 0, "with_retry_after": 0, "retried": 0, "admitted_on_retry": 0}


async def one(client: httpx.AsyncClient, delay: float, request: dict) -> None:
    await asyncio.sleep(delay)
    body = {"model": "SmolLM2-135M-Instruct", "prompt": request["prompt"],
            "max_tokens": request["max_tokens"], "ignore_eos": True}
    r = await client.post("/v1/completions", json=body)
    if r.status_code != 429:
        return
    stats["refused"] += 1
    retry_after = r.headers.get("retry-after")
    if retry_after is None or not retry_after.isdigit():
        return
    stats["with_retry_after"] += 1
    await asyncio.sleep(int(retry_after))
    stats["retried"] += 1
    again = await client.post("/v1/completions", json=body)
    stats["admitted_on_retry"] += again.status_code == 200


async def main() -> None:
    t, tasks = 0.0, []
    # Idle connections expire before the server's 5 s keep-alive does, so a request is
    # never sent on a connection the server is closing (the retries wait seconds).
    limits = httpx.Limits(max_connections=2000, keepalive_expiry=1.0)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", timeout=600, limits=limits
    ) as client:
        for request in requests:
            tasks.append(one(client, t, request))
            t += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    with open(out, "w") as f:
        json.dump(stats, f)


asyncio.run(main())
PY
stop_server

"$PY" - "$OUT" "$RATE" <<'PY'
import json
import sys

out, rate = sys.argv[1], float(sys.argv[2])


def summary(label: str) -> dict:
    with open(f"{out}/{label}/summary.json") as f:
        return json.load(f)["runs"][0]["summary"]


fcfs, slo = summary("fcfs"), summary("slo")
with open(f"{out}/retries.json") as f:
    retries = json.load(f)
with open(f"{out}/slo-metrics.json") as f:
    error = json.load(f)["ttft_prediction_error"]
for label, s in (("fcfs", fcfs), ("slo", slo)):
    print(
        f"{label:>5}: goodput {rate * s['goodput_fraction']:.2f} req/s "
        f"({s['goodput_fraction']:.0%} of {s['num_requests']} within SLO), "
        f"errors {s['num_errors']}"
    )
print(
    f"retry client: {retries['refused']} refused, {retries['with_retry_after']} with Retry-After, "
    f"{retries['admitted_on_retry']} of {retries['retried']} admitted on retry"
)
print("median absolute TTFT prediction error (slo run): " + ("-" if error is None else f"{error:.0%}"))
ratio = slo["goodput_fraction"] / fcfs["goodput_fraction"] if fcfs["goodput_fraction"] else float("inf")
honoured = retries["admitted_on_retry"] / retries["retried"] if retries["retried"] else float("nan")
everyone = retries["with_retry_after"] == retries["refused"]
print(f"every 429 carried a Retry-After: {'yes' if everyone else 'no'}")
print(f"served slo/fcfs goodput at 1.5x capacity: {ratio:.2f}x; retry-after honoured: {honoured:.0%}")
PY
