#!/usr/bin/env bash
# Served figures of the torch executor, measured from the client side by `orchestrator
# bench`, on this tree and on the code before the executor's speed-up (BASELINE_REF, the
# commit before it: fe70bfa), in the same run.
#
# Each side runs its own server on 127.0.0.1 from its own tree with its own copy of
# `make serve`'s config (configs/serve/smollm2-cpu.yaml); the baseline runs from a
# temporary git worktree (removed at exit) on this tree's virtual environment. Per side:
#   burst:         64 requests at once, prompts uniform 100-400 tokens from real text,
#                  outputs log-normal median 64 tokens (sigma 1.0, at most 256), EOS
#                  ignored; the baseline replays exactly the same workload file;
#   single stream: one client, 8 requests one after another, 128-token prompts and 128
#                  output tokens.
# ROUNDS rounds (default 2) alternate which side goes first, so both see the same
# background load; figures are medians over rounds. Prints a table and, last:
#   burst <X> output tok/s (before <Y>), TTFT p50 <A> ms (before <B>), TPOT p50 <C> ms
#   (before <D>); single stream TPOT p50 <E> ms (before <F>), TTFT p50 <G> ms (before <H>)
#
# Settings (environment): BASELINE_REF, CONFIG, PORT, ROUNDS, OUT (results folder),
# READY_TIMEOUT_S, PYTHON, NUM_THREADS (sets executor.num_threads in both sides' configs:
# on a machine where other work keeps a core busy, 2-thread steps stall at every OpenMP
# barrier and 1 thread is the only fair setting; unset keeps the configs as they are).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PY=${PYTHON:-$ROOT/.venv/bin/python}
BASELINE_REF=${BASELINE_REF:-fe70bfa}
CONFIG=${CONFIG:-configs/serve/smollm2-cpu.yaml}
PORT=${PORT:-8124}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-$ROOT/out/serve_burst}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-300}

die() {
    echo "serve_burst: $*" >&2
    exit 2
}

[[ -f $CONFIG ]] || die "$CONFIG not found"
git rev-parse --verify --quiet "$BASELINE_REF^{commit}" >/dev/null ||
    die "baseline $BASELINE_REF is not a commit here; set BASELINE_REF"
# shellcheck source=benchmarks/lib/serving.sh
source benchmarks/lib/serving.sh
require_free_port

rm -rf "$OUT"
mkdir -p "$OUT"
BASE_TREE=$(mktemp -d "${TMPDIR:-/tmp}/serve-burst-baseline.XXXXXX")
git worktree add --detach --quiet "$BASE_TREE" "$BASELINE_REF"

cleanup() {
    stop_server
    git worktree remove --force "$BASE_TREE" 2>/dev/null || rm -rf "$BASE_TREE"
}
trap cleanup EXIT

side_config() { # TREE SIDE: the tree's own config, with NUM_THREADS applied if set
    if [[ -z ${NUM_THREADS:-} ]]; then
        echo "$1/$CONFIG"
        return
    fi
    edit_config "$1/$CONFIG" "$OUT/$2.yaml" \
        "config.setdefault('executor', {})['num_threads'] = $NUM_THREADS"
    echo "$OUT/$2.yaml"
}

start_server() { # TREE LOG CONFIG: the tree's own code (first on sys.path)
    launch_server "$2" bash -c 'cd "$1" && exec env PYTHONPATH="$1" "$2" -m orchestrator.cli serve \
        --config "$3" --host 127.0.0.1 --port "$4"' _ "$1" "$PY" "$3" "$PORT"
}

bench() { # DIR ARGS...
    local dir=$1
    shift
    "$PY" -m orchestrator.cli bench --url "http://127.0.0.1:$PORT" --result-dir "$dir" \
        --seed 0 --no-progress "$@" >"$dir.log" 2>&1 || die "bench failed; see $dir.log"
}

run_side() { # SIDE TREE ROUND
    local side=$1 tree=$2 round=$3 dir="$OUT/round$3"
    mkdir -p "$dir"
    echo "== round $round: $side ($tree)" >&2
    start_server "$tree" "$dir/serve-$side.log" "$(side_config "$tree" "$side")"
    # Warm-up (not reported): first-use costs such as kernel builds and primitive caches.
    bench "$dir/warmup-$side" --num-requests 4 --load burst --input-len 256 --output-len 16
    local workload=()
    if [[ -f $OUT/burst-workload.jsonl ]]; then
        workload=(--workload "$OUT/burst-workload.jsonl")
    else
        workload=(--num-requests 64 --input-len uniform:100:400 --output-len lognormal:64:1.0:256)
    fi
    bench "$dir/burst-$side" --label "burst-$side" --load burst "${workload[@]}"
    [[ -f $OUT/burst-workload.jsonl ]] || cp "$dir/burst-$side/workload.jsonl" "$OUT/burst-workload.jsonl"
    bench "$dir/single-$side" --label "single-$side" --load concurrency --concurrency 1 \
        --num-requests 8 --input-len 128 --output-len 128
    stop_server
}

for ((round = 1; round <= ROUNDS; round++)); do
    if ((round % 2)); then
        run_side before "$BASE_TREE" "$round"
        run_side after "$ROOT" "$round"
    else
        run_side after "$ROOT" "$round"
        run_side before "$BASE_TREE" "$round"
    fi
done

"$PY" - "$OUT" "$ROUNDS" "$BASELINE_REF" "${NUM_THREADS:-}" <<'PY'
import json
import statistics
import sys
from pathlib import Path

out, rounds, ref = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
threads = f", executor.num_threads {sys.argv[4]} on both" if sys.argv[4] else ""


def summary(run: str, side: str, r: int) -> dict:
    doc = json.loads((out / f"round{r}" / f"{run}-{side}" / "summary.json").read_text())
    return doc["runs"][0]["summary"]


def median(run: str, side: str, key: str, pct: str | None = None) -> float:
    values = []
    for r in range(1, rounds + 1):
        s = summary(run, side, r)
        v = s[key] if pct is None else s[key][pct]
        if v is not None:
            values.append(v)
    return statistics.median(values) if values else float("nan")


fig = {
    (run, side): (
        median(run, side, "output_throughput_tok_s"),
        1e3 * median(run, side, "ttft_s", "p50"),
        1e3 * median(run, side, "tpot_s", "p50"),
    )
    for run in ("burst", "single")
    for side in ("before", "after")
}
print(f"medians over {rounds} rounds; before = {ref}, after = this tree{threads}")
print(f"{'run':8} {'side':7} {'output tok/s':>13} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12}")
for (run, side), (tok, ttft, tpot) in fig.items():
    print(f"{run:8} {side:7} {tok:13.1f} {ttft:12.0f} {tpot:12.1f}")
b, bb = fig["burst", "after"], fig["burst", "before"]
s, sb = fig["single", "after"], fig["single", "before"]
print(
    f"burst {b[0]:.0f} output tok/s (before {bb[0]:.0f}), TTFT p50 {b[1]:.0f} ms (before "
    f"{bb[1]:.0f}), TPOT p50 {b[2]:.1f} ms (before {bb[2]:.1f}); single stream TPOT p50 "
    f"{s[2]:.1f} ms (before {sb[2]:.1f}), TTFT p50 {s[1]:.0f} ms (before {sb[1]:.0f})"
)
PY
