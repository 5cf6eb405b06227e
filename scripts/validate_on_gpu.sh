#!/usr/bin/env bash
# One-shot check of the TensorRT-LLM LLM-API executor on a real GPU. Run it inside the NGC
# TensorRT-LLM container (TensorRT-LLM 1.2.1 or newer), from the project root, after
# `pip install -e .`:
#
#   scripts/validate_on_gpu.sh [MODEL] [PORT]
#
# MODEL is a small Llama checkpoint: a Hugging Face Hub id (downloaded once) or a local
# folder; default TinyLlama/TinyLlama-1.1B-Chat-v1.0. PORT defaults to 8011.
#
# NOT YET RUN ON A GPU: no GPU or TensorRT-LLM was available where it was written.
#
# One path per release line, chosen by what the installed TensorRT-LLM has:
# - with the engine backend (1.2.x; `tensorrt_llm.bindings.executor.Executor` exists):
#   the names of both modes are checked (`check_names --mode all`);
# - without it (1.3.0rc21 and later, the 1.4 line: the bindings module imports but has no
#   `Executor`): LLM-API mode only (`check_names --mode llm-api`), engine mode reported
#   as not available.
# Then, on both lines: (2) greedy references from TensorRT-LLM's own `LLM.generate`, one
# prompt at a time, on an `LLM` built with exactly the options the served executor uses
# (plugins.trtllm.llm_api.translate.start_llm on the same executor config); (3) our
# gateway in LLM-API mode, the same greedy requests one at a time through
# /v1/completions; (4) `orchestrator bench` for about a minute (Poisson arrivals, 4
# requests/s, 240 requests); (5) the in-executor path (`executor.scheduling:
# in_executor`, our scheduler inside TensorRT-LLM's executor loop): its names
# (`check_names --mode in-executor`); on a release outside the range it was checked
# against, that the gateway refuses to start with a message naming the range; inside it,
# the same greedy requests as (3) through an in-executor gateway, then a served
# comparison under the SLO config (two SLO classes, SLO admission and budget) of
# TensorRT-LLM's own scheduler under ours (`scheduling: front`) against ours inside the
# loop: TPOT p99 and goodput of the same Poisson workload, side by side
# (`orchestrator bench --compare`). Each check prints its own result line as it ends.
#
# THE IN-EXECUTOR PATH HAS NOT RUN ON A GPU EITHER: its figures exist only once a user
# runs this script; until then nothing claims it works on TensorRT-LLM.
#
# What even a passing run does not cover (it runs one GPU, short prompts, no grammar):
# tensor parallelism above 1 (rank 0 deciding for the others over dist.broadcast, the
# facts channel to a worker process), guided decoding (refused in the in-executor mode,
# but untested on the front path here), and preemption of sequences longer than 2048
# tokens (the pause cap the in-executor factory raises); the summary line says so.
#
# The greedy rule: a prompt agrees when our text equals the reference's decoded tokens
# up to the first divergence, and that divergence (if any) is at token MIN_AGREE or
# later: two greedy runs may part at a near-tie once batch shapes differ, which is not a
# bug, but an early divergence is. Exact matches are counted too.
#
# It prints one summary line and exits 0 only if every check passed. Logs and results
# stay in $WORK_DIR (default: a new folder under /tmp).
set -euo pipefail

MODEL=${1:-TinyLlama/TinyLlama-1.1B-Chat-v1.0}
PORT=${2:-8011}
PYTHON=${PYTHON:-python3}
WORK_DIR=${WORK_DIR:-$(mktemp -d /tmp/validate-trtllm.XXXXXX)}
PROMPTS=8
MAX_TOKENS=24
MIN_AGREE=8
mkdir -p "$WORK_DIR"
log() { echo "[validate] $*" >&2; }

if ! "$PYTHON" -c "import orchestrator, plugins.trtllm" 2>/dev/null; then
  log "the project is not importable: run 'pip install -e .' in the project root first"
  exit 2
fi

# ---------------------------------------------------------------- 1. names
engines=$("$PYTHON" -c "import tensorrt_llm.bindings.executor as e; print(hasattr(e, 'Executor'))" 2>/dev/null || echo False)
if [[ $engines == True ]]; then
  line="with the engine backend (1.2.x)"; modes=all
else
  line="without the engine backend (LLM-API mode only)"; modes=llm-api
fi
log "release line: $line"
log "1/5 checking TensorRT-LLM names, --mode $modes (log: $WORK_DIR/names.log)"
names=FAIL
if "$PYTHON" -m plugins.trtllm.check_names --mode "$modes" >"$WORK_DIR/names.log" 2>&1; then
  names=OK
fi
grep -E "^SKIPPED|^MISSING" "$WORK_DIR/names.log" >&2 || true
log "names: $names ($(tail -n 1 "$WORK_DIR/names.log"))"
if [[ $engines != True ]]; then
  log "engine mode: not available on this release (no Executor), not checked"
fi

# ---------------------------------------------------------------- 2. references
cat >"$WORK_DIR/executor.json" <<JSON
{"model": "MODEL", "max_seq_len": 2048, "max_batch_size": 32, "max_num_tokens": 4096,
 "kv_cache_free_gpu_memory_fraction": 0.5}
JSON
log "2/5 greedy references from TensorRT-LLM's LLM.generate (log: $WORK_DIR/reference.log)"
references=FAIL
if "$PYTHON" - "$MODEL" "$WORK_DIR" "$PROMPTS" "$MAX_TOKENS" >"$WORK_DIR/reference.log" 2>&1 <<'PY'
import json, sys
from pathlib import Path

model, work, n, max_tokens = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if not Path(model).is_dir():
    from huggingface_hub import snapshot_download
    model = snapshot_download(model)
from transformers import AutoTokenizer
import tensorrt_llm.llmapi as llmapi
from plugins.trtllm.llm_api import translate
from plugins.trtllm.llm_api.config import TrtllmLlmApiConfig
from plugins.trtllm.llm_api.settings import load_settings

texts = [
    "The capital of France is", "Paged attention stores the KV cache in",
    "In 1969 the first people to walk on the Moon were", "A haiku about GPUs:",
    "def fibonacci(n):", "The three primary colours are", "Water boils at",
    "The quick brown fox",
][:n]
tokenizer = AutoTokenizer.from_pretrained(model)
prompts = [tokenizer.encode(t) for t in texts]
options = json.loads((work / "executor.json").read_text()) | {"model": model}
settings = load_settings(TrtllmLlmApiConfig(**options))
# The served executor's own LLM options, so both sides batch, chunk and graph alike.
llm = translate.start_llm(llmapi, settings, translate.release_options(llmapi))
try:
    params = llmapi.SamplingParams(max_tokens=max_tokens, top_k=1, ignore_eos=True)
    refs = [list(llm.generate(p, params).outputs[0].token_ids) for p in prompts]
finally:
    llm.shutdown()
(work / "references.json").write_text(json.dumps({"model": model, "prompts": prompts, "tokens": refs}))
print(f"{len(refs)} references from {model}")
PY
then
  references=OK
fi
log "references: $references"
if [[ $references != OK ]]; then
  echo "validate_on_gpu: FAIL | names $names | references failed: see $WORK_DIR/reference.log"
  exit 1
fi
LOCAL_MODEL=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['model'])" "$WORK_DIR/references.json")

# ---------------------------------------------------------------- 3. gateway
# serve_config SCHEDULER SCHEDULING: the gateway's config in LLM-API mode, the one both
# served steps use. SCHEDULER picks the scheduler section: "priority" (step 3) or "slo"
# (step 5: our classes, admission and budget); SCHEDULING is executor.scheduling
# (front, TensorRT-LLM's scheduler under ours, or in_executor).
serve_config() {
  local scheduler
  if [[ $1 == slo ]]; then
    scheduler="scheduler:
  policy: slo
  aging_rate: 1.0
  max_batch_size: 32
  max_num_tokens: 4096
  chunk_size: 512
  slo_classes:
    interactive: {ttft_ms: 500, tpot_ms: 80}
  default_slo_class: interactive
  admission: {type: slo}
  slo_budget: {enabled: true}"
  else
    scheduler="scheduler:
  policy: priority
  max_batch_size: 32
  max_num_tokens: 4096
  chunk_size: 2048"
  fi
  cat <<YAML
model:
  name: validate
  source: $LOCAL_MODEL
  max_model_len: 2048
$scheduler
cache:
  block_size: 32
  enable_prefix_caching: true
executor:
  type: trtllm-llmapi
  model: $LOCAL_MODEL
  max_seq_len: 2048
  max_batch_size: 32
  max_num_tokens: 4096
  kv_cache_free_gpu_memory_fraction: 0.5
  scheduling: $2
server:
  host: 127.0.0.1
  port: $PORT
YAML
}
serve_config priority front >"$WORK_DIR/serve.yaml"
GATEWAY=
stop_gateway() {
  if [[ -n $GATEWAY ]]; then kill "$GATEWAY" 2>/dev/null || true; wait "$GATEWAY" 2>/dev/null || true; fi
  GATEWAY=
}
trap stop_gateway EXIT
# start_gateway CONFIG LOG: serve CONFIG in the background; 0 once /ready answers.
start_gateway() {
  orchestrator serve --config "$1" >"$2" 2>&1 &
  GATEWAY=$!
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null; then return 0; fi
    if ! kill -0 "$GATEWAY" 2>/dev/null; then log "the gateway exited: see $2"; GATEWAY=; return 1; fi
    sleep 1
  done
  return 1
}
log "3/5 starting the gateway in LLM-API mode on port $PORT (log: $WORK_DIR/gateway.log)"
start_gateway "$WORK_DIR/serve.yaml" "$WORK_DIR/gateway.log" || true
# greedy_check: the greedy requests of (2) through the running gateway, one at a time.
greedy_check() {
"$PYTHON" - "$WORK_DIR" "$PORT" "$MAX_TOKENS" "$MIN_AGREE" <<'PY'
import json, sys, urllib.request
from pathlib import Path

work, port, max_tokens, min_agree = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ref = json.loads((work / "references.json").read_text())
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(ref["model"])
exact = agreed = 0
for prompt, tokens in zip(ref["prompts"], ref["tokens"]):
    body = {"model": "validate", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            text = json.load(response)["choices"][0]["text"]
    except Exception as err:
        print(f"request failed: {err}", file=sys.stderr)
        continue
    # How many reference tokens our text reproduces before the first divergence.
    same = max(k for k in range(len(tokens) + 1)
               if text.startswith(tokenizer.decode(tokens[:k], skip_special_tokens=True)))
    exact += same == len(tokens)
    agreed += same == len(tokens) or same >= min_agree
    if same < len(tokens):
        print(f"DIVERGES at token {same} {prompt[:8]}...\n  ours:         {text!r}\n"
              f"  TensorRT-LLM: {tokenizer.decode(tokens, skip_special_tokens=True)!r}",
              file=sys.stderr)
print(f"{agreed}/{len(ref['prompts'])} agree ({exact} exact)")
PY
}
greedy=$(greedy_check) || greedy="0/$PROMPTS agree (request loop failed)"
log "greedy: $greedy (rule: equal up to a divergence at token $MIN_AGREE or later)"

# ---------------------------------------------------------------- 4. bench
log "4/5 orchestrator bench for about a minute (results: $WORK_DIR/bench)"
bench="bench failed"
if orchestrator bench --url "http://127.0.0.1:$PORT" --model validate --load poisson --rate 4 \
    --num-requests 240 --input-len 256 --output-len 128 --tokenizer "$LOCAL_MODEL" \
    --result-dir "$WORK_DIR/bench" --no-progress >"$WORK_DIR/bench.log" 2>&1; then
  bench=$("$PYTHON" - "$WORK_DIR/bench/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
ms = lambda d: "n/a" if d.get("p50") is None else f"{1000 * d['p50']:.0f} ms"
print(f"{s['num_completed']}/{s['num_requests']} completed, {s['num_errors']} errors, "
      f"{s['output_throughput_tok_s'] or 0:.0f} tok/s, TTFT p50 {ms(s['ttft_s'])}, "
      f"TPOT p50 {ms(s['tpot_s'])}")
PY
)
fi
log "bench: $bench"

# ---------------------------------------------------------------- 5. in-executor
stop_gateway
log "5/5 in-executor scheduling (logs: $WORK_DIR/in_executor*.log)"
inexec_names=FAIL
if "$PYTHON" -m plugins.trtllm.check_names --mode in-executor >"$WORK_DIR/in_executor_names.log" 2>&1; then
  inexec_names=OK
fi
grep -E "^MISSING|^note" "$WORK_DIR/in_executor_names.log" >&2 || true
checked=$("$PYTHON" -c "
import tensorrt_llm
from plugins.trtllm.in_executor.install import release_line
try:
    release_line(tensorrt_llm.__version__); print(True)
except Exception:
    print(False)" 2>/dev/null || echo False)
serve_config slo front >"$WORK_DIR/serve-slo-front.yaml"
serve_config slo in_executor >"$WORK_DIR/serve-slo-in-executor.yaml"
# served_bench NAME: the SLO workload against the running gateway, into $WORK_DIR/NAME.
served_bench() {
  orchestrator bench --url "http://127.0.0.1:$PORT" --model validate --load poisson --rate 8 \
    --num-requests 480 --input-len 512 --output-len 256 --seed 7 --tokenizer "$LOCAL_MODEL" \
    --slo-ttft-ms 500 --slo-tpot-ms 80 --result-dir "$WORK_DIR/$1" --no-progress \
    >"$WORK_DIR/$1.log" 2>&1
}
inexec="not run"
if [[ $checked != True ]]; then
  # Outside the checked range: the gateway must refuse to start, naming the range.
  inexec="refused at start (release outside the checked range)"
  if start_gateway "$WORK_DIR/serve-slo-in-executor.yaml" "$WORK_DIR/in_executor_gateway.log"; then
    inexec="FAIL: started on a release outside the checked range"
  elif ! grep -q "checked against TensorRT-LLM 1.2.x and 1.3.x" "$WORK_DIR/in_executor_gateway.log"; then
    inexec="FAIL: refused without naming the checked range"
  fi
  stop_gateway
else
  inexec_greedy="not run"; comparison="not run"
  if start_gateway "$WORK_DIR/serve-slo-front.yaml" "$WORK_DIR/in_executor_front.log" \
      && served_bench slo-front; then
    comparison="front measured"
  fi
  stop_gateway
  if start_gateway "$WORK_DIR/serve-slo-in-executor.yaml" "$WORK_DIR/in_executor_gateway.log"; then
    inexec_greedy=$(greedy_check) || inexec_greedy="0/$PROMPTS agree (request loop failed)"
    if [[ $comparison == "front measured" ]] && served_bench slo-in-executor; then
      orchestrator bench --compare "$WORK_DIR/slo-front/summary.json" \
        "$WORK_DIR/slo-in-executor/summary.json" >"$WORK_DIR/in_executor_compare.txt" 2>&1 || true
      comparison=$("$PYTHON" - "$WORK_DIR" <<'PY'
import json, sys
from pathlib import Path

work = Path(sys.argv[1])
def summary(name):
    return json.loads((work / name / "summary.json").read_text())["runs"][0]["summary"]
a, b = summary("slo-front"), summary("slo-in-executor")
ms = lambda s: "n/a" if s["tpot_s"].get("p99") is None else f"{1000 * s['tpot_s']['p99']:.0f} ms"
good = lambda s: f"{s['goodput_req_s'] or 0:.2f} req/s ({100 * (s['goodput_fraction'] or 0):.0f}%)"
print(f"TPOT p99 {ms(a)} (TensorRT-LLM's scheduler) vs {ms(b)} (ours in the loop); "
      f"goodput {good(a)} vs {good(b)}; errors {a['num_errors']} vs {b['num_errors']}")
PY
)
    fi
  fi
  stop_gateway
  inexec="greedy $inexec_greedy | $comparison"
fi
log "in-executor: names $inexec_names | $inexec (side by side: $WORK_DIR/in_executor_compare.txt)"

version=$("$PYTHON" -c "import tensorrt_llm; print(tensorrt_llm.__version__)" 2>/dev/null || echo unknown)
verdict=FAIL
inexec_ok=false
if [[ $checked != True && $inexec == "refused at start"* ]]; then inexec_ok=true; fi
if [[ $checked == True && $inexec_names == OK && $inexec == "greedy $PROMPTS/$PROMPTS agree"* && $inexec == *"TPOT p99"* ]]; then
  inexec_ok=true
fi
if [[ $names == OK && $greedy == "$PROMPTS/$PROMPTS agree"* && $bench == *" 0 errors"* && $inexec_ok == true ]]; then
  verdict=PASS
fi
echo "validate_on_gpu: $verdict | TensorRT-LLM $version, $line | names $names | greedy $greedy with LLM.generate | bench: $bench | in-executor: names $inexec_names, $inexec | not covered: TP > 1, guided decoding, preemption past 2048 tokens | $WORK_DIR"
[[ $verdict == PASS ]]
