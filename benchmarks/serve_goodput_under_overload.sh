#!/usr/bin/env bash
# Goodput under overload through the real gateway and the CPU model: fcfs vs SLO-aware
# scheduling, measured from the client side by `orchestrator bench`, plus whether the
# Retry-After of SLO refusals can be honoured.
#
# 1. Serves CONFIG_FCFS (configs/serve/smollm2-cpu.yaml with `policy: fcfs` and the SLO
#    classes of CONFIG_SLO, queue limits only) and measures its capacity: completed
#    requests/s of a closed loop of CONCURRENCY clients.
# 2. Offers LOAD (1.5) x that capacity, Poisson, to it, then the same requests (the saved
#    workload.jsonl) to CONFIG_SLO (configs/serve/smollm2-cpu-slo.yaml).
# 3. Against the SLO server again, a client that honours Retry-After: each request
#    refused with 429 checks that the header is there, waits that long and retries once;
#    the share of retries admitted is printed.
# 4. Reads the engine's median TTFT prediction error from /metrics.
#
# The SLO judged is the interactive class's (SLO_TTFT_MS / SLO_TPOT_MS). Last line:
#   served slo/fcfs goodput at 1.5x capacity: <X>x; retry-after honoured: <Y>%
#
# Settings (environment): CONFIG_SLO, PORT, NUM_REQUESTS, CONCURRENCY, LOAD, INPUT_LEN,
# OUTPUT_LEN, SEED, SLO_TTFT_MS, SLO_TPOT_MS, OUT, READY_TIMEOUT_S, ORCHESTRATOR, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

ORCH=${ORCHESTRATOR:-.venv/bin/orchestrator}
PY=${PYTHON:-.venv/bin/python}
CONFIG_SLO=${CONFIG_SLO:-configs/serve/smollm2-cpu-slo.yaml}
PORT=${PORT:-8124}
NUM_REQUESTS=${NUM_REQUESTS:-60}
CONCURRENCY=${CONCURRENCY:-8}
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
"$PY" -c "import socket, sys; sys.exit(socket.socket().connect_ex(('127.0.0.1', $PORT)) == 0)" ||
    die "port $PORT is already in use; set PORT"

rm -rf "$OUT"
mkdir -p "$OUT"
CONFIG_FCFS="$OUT/serve-fcfs.yaml"
"$PY" - "$CONFIG_SLO" "$CONFIG_FCFS" <<'PY'
import sys

import yaml

src, dst = sys.argv[1:]
with open(src) as f:
    config = yaml.safe_load(f)
sched = config["scheduler"]
sched["policy"] = "fcfs"
for key in ("admission", "slo_budget", "fair_share"):
    sched.pop(key, None)  # today's defaults: queue limits, fixed budget, no fair share
with open(dst, "w") as f:
    yaml.safe_dump(config, f, sort_keys=False)
PY

SERVER_PID=""
stop_server() {
    if [[ -n $SERVER_PID ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
trap stop_server EXIT

start_server() { # CONFIG LOG
    "$ORCH" serve --config "$1" --host 127.0.0.1 --port "$PORT" >"$2" 2>&1 &
    SERVER_PID=$!
    "$PY" - "$PORT" "$READY_TIMEOUT_S" "$SERVER_PID" <<'PY' || die "server did not start; see $2"
import os
import sys
import time

import httpx

port, timeout_s, pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + timeout_s
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("the server exited before it was ready")
    try:
        if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(1)
sys.exit(f"the server was not ready after {timeout_s:g} s")
PY
}

bench() { # LABEL ARGS...
    local label=$1
    shift
    "$ORCH" bench --url "http://127.0.0.1:$PORT" --label "$label" --result-dir "$OUT/$label" \
        --seed "$SEED" --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" \
        --no-progress "$@" >"$OUT/$label.txt"
}

field() { # SUMMARY_JSON KEY
    "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['runs'][0]['summary'][sys.argv[2]])" "$@"
}

start_server "$CONFIG_FCFS" "$OUT/serve-fcfs.log"
echo "== capacity: closed loop of $CONCURRENCY clients" >&2
bench capacity --load concurrency --concurrency "$CONCURRENCY" --num-requests "$NUM_REQUESTS" \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
CAPACITY=$(field "$OUT/capacity/summary.json" request_throughput_req_s)
RATE=$("$PY" -c "print(round($CAPACITY * $LOAD, 3))")
echo "== capacity $CAPACITY req/s; offering $RATE req/s" >&2
bench fcfs --load poisson --rate "$RATE" --num-requests "$NUM_REQUESTS" \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
stop_server

start_server "$CONFIG_SLO" "$OUT/serve-slo.log"
bench slo --load poisson --rate "$RATE" --workload "$OUT/fcfs/workload.jsonl"
echo "== retry client at $RATE req/s" >&2
"$PY" - "$PORT" "$RATE" "$NUM_REQUESTS" "$SEED" "$OUT/retries.json" <<'PY'
"""Poisson arrivals; a 429 must carry Retry-After; wait it out and retry once."""
import asyncio
import json
import random
import re
import sys

import httpx

port, rate, n, seed, out = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = random.Random(seed)
stats = {"requests": n, "refused": 0, "with_retry_after": 0, "retried": 0, "admitted_on_retry": 0}


async def one(client: httpx.AsyncClient, delay: float, words: int, tokens: int) -> None:
    await asyncio.sleep(delay)
    body = {"model": "SmolLM2-135M-Instruct", "prompt": " ".join(["serving"] * words),
            "max_tokens": tokens, "ignore_eos": True}
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
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
        for _ in range(n):
            tasks.append(one(client, t, rng.randint(32, 128), rng.randint(16, 48)))
            t += rng.expovariate(rate)
        await asyncio.gather(*tasks)
        metrics = (await client.get("/metrics")).text
    match = re.search(r"^orchestrator_ttft_prediction_error (\S+)$", metrics, re.M)
    stats["ttft_prediction_error"] = float(match.group(1)) if match else None
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
error = retries["ttft_prediction_error"]
print("median absolute TTFT prediction error: " + ("-" if error is None else f"{error:.0%}"))
ratio = slo["goodput_fraction"] / fcfs["goodput_fraction"] if fcfs["goodput_fraction"] else float("inf")
honoured = retries["admitted_on_retry"] / retries["retried"] if retries["retried"] else float("nan")
everyone = retries["with_retry_after"] == retries["refused"]
print(f"every 429 carried a Retry-After: {'yes' if everyone else 'no'}")
print(f"served slo/fcfs goodput at 1.5x capacity: {ratio:.2f}x; retry-after honoured: {honoured:.0%}")
PY
