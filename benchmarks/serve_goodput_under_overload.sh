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
# Before that, a sweep (SWEEP=1, the default; SWEEP_ONLY=1 runs nothing else): the
# shipped default config (CONFIG_DEFAULT) against CONFIG_SLO at SWEEP_LOADS (0.5 1 2 4)
# x the default config's capacity (closed loop as in 1, or SWEEP_CAPACITY req/s), as a
# short burst (BURST_REQUESTS, 64) and sustained Poisson arrivals (SUSTAINED_S, 30 s of
# them at the cell's rate, at least SUSTAINED_REQUESTS, 256: a fixed count would last
# 18 s at 2x on a CPU with a capacity of 7 req/s but under 5 s, barely past the 3 s TTFT
# target, on one with 27) (SWEEP_SHAPES, "burst sustained", picks which); REPEATS (3) runs per cell, each config on a fresh server, the two on the same
# requests (seed SEED + repeat), which goes first alternating; per cell the medians of
# goodput (their ratio), requests within the SLO, 429s and 503s, and the slo server's
# regretted refusals (orchestrator_admission_regretted_refusals_total). Its last line:
#   served sweep slo/default goodput, burst: 0.5x <A>x, ...; sustained: 0.5x <B>x, ...
# A smoke run: SWEEP_ONLY=1 SWEEP_LOADS=4 BURST_REQUESTS=8 SUSTAINED_REQUESTS=16 SUSTAINED_S=0 REPEATS=1
# SWEEP_CAPACITY=4 (no capacity run).
#
# The SLO judged is the interactive class's (SLO_TTFT_MS / SLO_TPOT_MS). Last line:
#   served slo/fcfs goodput at 1.5x capacity: <X>x; retry-after honoured: <Y>%
#
# Settings (environment): CONFIG_SLO, PORT, CAPACITY_REQUESTS, CONCURRENCY, DURATION_S,
# LOAD, INPUT_LEN, OUTPUT_LEN, SEED, SLO_TTFT_MS, SLO_TPOT_MS, OUT, READY_TIMEOUT_S, ORCHESTRATOR, PYTHON,
# and for the sweep SWEEP, SWEEP_ONLY, CONFIG_DEFAULT, SWEEP_LOADS, BURST_REQUESTS,
# SUSTAINED_REQUESTS, SUSTAINED_S, SWEEP_SHAPES, REPEATS, SWEEP_CAPACITY.
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
SWEEP=${SWEEP:-1}
SWEEP_ONLY=${SWEEP_ONLY:-0}
CONFIG_DEFAULT=${CONFIG_DEFAULT:-configs/serve/smollm2-cpu.yaml}
SWEEP_LOADS=${SWEEP_LOADS:-0.5 1 2 4}
SWEEP_SHAPES=${SWEEP_SHAPES:-burst sustained}
BURST_REQUESTS=${BURST_REQUESTS:-64}
SUSTAINED_REQUESTS=${SUSTAINED_REQUESTS:-256}
SUSTAINED_S=${SUSTAINED_S:-30}
REPEATS=${REPEATS:-3}
SWEEP_CAPACITY=${SWEEP_CAPACITY:-}

die() {
    echo "serve_goodput_under_overload: $*" >&2
    exit 2
}

[[ -f $CONFIG_SLO ]] || die "$CONFIG_SLO not found"
[[ -f $CONFIG_DEFAULT ]] || die "$CONFIG_DEFAULT not found"
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

regretted() { # OUT_JSON: the slo server's regretted refusals (all classes), from /metrics
    "$PY" - "$PORT" "$1" <<'PY'
import json
import re
import sys

import httpx

port, out = int(sys.argv[1]), sys.argv[2]
metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
found = re.findall(r"^orchestrator_admission_regretted_refusals_total\{[^}]*\} (\S+)$", metrics, re.M)
with open(out, "w") as f:
    json.dump({"regretted": sum(float(v) for v in found)}, f)
PY
}

sweep_run() { # NAME CONFIG LABEL BENCH_ARGS...: one bench run on a fresh server
    local name=$1 config=$2 label=$3
    shift 3
    start_server "$config" "$OUT/$label.log"
    bench "$label" "$@"
    if [[ $name == slo ]]; then
        regretted "$OUT/$label-metrics.json"
    fi
    stop_server
}

sweep() {
    mkdir -p "$OUT/sweep"
    local capacity=$SWEEP_CAPACITY
    if [[ -z $capacity ]]; then
        start_server "$CONFIG_DEFAULT" "$OUT/sweep/capacity.log"
        echo "== sweep capacity (default config): closed loop of $CONCURRENCY clients" >&2
        bench sweep/capacity --load concurrency --concurrency "$CONCURRENCY" \
            --num-requests "$CAPACITY_REQUESTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
        capacity=$(summary_field "$OUT/sweep/capacity/summary.json" request_throughput_req_s)
        stop_server
    fi
    local shape n load rate r cell first second turn=0
    for shape in $SWEEP_SHAPES; do
        for load in $SWEEP_LOADS; do
            rate=$("$PY" -c "print(round($capacity * $load, 3))")
            n=$BURST_REQUESTS
            if [[ $shape == sustained ]]; then
                n=$("$PY" -c "print(max($SUSTAINED_REQUESTS, round($rate * $SUSTAINED_S)))")
            fi
            for ((r = 0; r < REPEATS; r++)); do
                cell="sweep/$shape-${load}x-r$r"
                # Which config goes first alternates, so a drifting machine favours neither.
                first=default second=slo
                if ((turn++ % 2)); then first=slo second=default; fi
                echo "== sweep $shape ${load}x ($rate req/s, $n requests) repeat $r: $first, then $second" >&2
                # Each repeat draws its own requests (seed SEED + r); both configs get them.
                SEED=$((SEED + r)) sweep_run "$first" "$(config_of "$first")" "$cell-$first" \
                    --load poisson --rate "$rate" --num-requests "$n" \
                    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN"
                SEED=$((SEED + r)) sweep_run "$second" "$(config_of "$second")" "$cell-$second" \
                    --load poisson --rate "$rate" --workload "$OUT/$cell-$first/workload.jsonl"
            done
        done
    done
    "$PY" - "$OUT/sweep" "$capacity" "$SWEEP_LOADS" "$REPEATS" "$SWEEP_SHAPES" <<'PY'
"""Medians over the repeats of each cell: goodput and its slo/default ratio, requests
within the SLO, 429s and 503s, and the slo server's regretted refusals."""
import json
import statistics
import sys

out, capacity, loads, repeats = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4])
shapes = sys.argv[5].split()


def run(cell: str, name: str) -> dict:
    with open(f"{out}/{cell}-{name}/summary.json") as f:
        data = json.load(f)["runs"][0]
    s = data["summary"]
    errors = s.get("errors_by_status", {})
    row = {
        "goodput": s["goodput_fraction"],
        "met": round(s["goodput_fraction"] * s["num_requests"]),
        "429": errors.get("429", 0),
        "503": errors.get("503", 0),
        "regretted": 0.0,
    }
    if name == "slo":
        with open(f"{out}/{cell}-slo-metrics.json") as f:
            row["regretted"] = json.load(f)["regretted"]
    return row


print(f"capacity (default config, closed loop): {capacity:.2f} req/s; medians of {repeats}")
print(f"{'shape':>9} {'load':>5} {'slo/default':>11}  {'slo met/429/503':>15} {'regret':>6}  {'default met/429/503':>19}")
headline = {}
for shape in shapes:
    ratios = []
    for load in loads:
        cells = [f"{shape}-{load}x-r{r}" for r in range(repeats)]
        slo = [run(c, "slo") for c in cells]
        base = [run(c, "default") for c in cells]

        def med(rows: list, key: str) -> float:
            return statistics.median(row[key] for row in rows)

        # Goodput per cell is the offered rate x the share within the SLO; the rate is
        # the same for both configs, so the ratio is that of the shares.
        g_slo, g_base = med(slo, "goodput"), med(base, "goodput")
        ratio = f"{g_slo / g_base:.2f}x" if g_base else "inf"
        ratios.append(f"{load}x {ratio}")
        s_cell = f"{med(slo, 'met'):g}/{med(slo, '429'):g}/{med(slo, '503'):g}"
        b_cell = f"{med(base, 'met'):g}/{med(base, '429'):g}/{med(base, '503'):g}"
        print(f"{shape:>9} {load:>4}x {ratio:>11}  {s_cell:>15} {med(slo, 'regretted'):>6g}  {b_cell:>19}")
    headline[shape] = ", ".join(ratios)
print("served sweep slo/default goodput, " + "; ".join(f"{s}: {headline[s]}" for s in shapes))
PY
}

config_of() { # NAME: the config file a sweep run serves
    if [[ $1 == slo ]]; then echo "$CONFIG_SLO_RUN"; else echo "$CONFIG_DEFAULT"; fi
}

if [[ $SWEEP == 1 || $SWEEP_ONLY == 1 ]]; then
    sweep
fi
if [[ $SWEEP_ONLY == 1 ]]; then
    exit 0
fi

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
