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
# requests/s, 240 requests). Each check prints its own result line as it ends.
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
log "1/4 checking TensorRT-LLM names, --mode $modes (log: $WORK_DIR/names.log)"
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
log "2/4 greedy references from TensorRT-LLM's LLM.generate (log: $WORK_DIR/reference.log)"
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
cat >"$WORK_DIR/serve.yaml" <<YAML
model:
  name: validate
  source: $LOCAL_MODEL
  max_model_len: 2048
scheduler:
  policy: priority
  max_batch_size: 32
  max_num_tokens: 4096
  chunk_size: 2048
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
server:
  host: 127.0.0.1
  port: $PORT
YAML
log "3/4 starting the gateway in LLM-API mode on port $PORT (log: $WORK_DIR/gateway.log)"
orchestrator serve --config "$WORK_DIR/serve.yaml" >"$WORK_DIR/gateway.log" 2>&1 &
GATEWAY=$!
trap 'kill "$GATEWAY" 2>/dev/null || true; wait "$GATEWAY" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null; then break; fi
  if ! kill -0 "$GATEWAY" 2>/dev/null; then log "the gateway exited: see $WORK_DIR/gateway.log"; break; fi
  sleep 1
done
greedy=$("$PYTHON" - "$WORK_DIR" "$PORT" "$MAX_TOKENS" "$MIN_AGREE" <<'PY'
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
) || greedy="0/$PROMPTS agree (request loop failed)"
log "greedy: $greedy (rule: equal up to a divergence at token $MIN_AGREE or later)"

# ---------------------------------------------------------------- 4. bench
log "4/4 orchestrator bench for about a minute (results: $WORK_DIR/bench)"
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

version=$("$PYTHON" -c "import tensorrt_llm; print(tensorrt_llm.__version__)" 2>/dev/null || echo unknown)
verdict=FAIL
if [[ $names == OK && $greedy == "$PROMPTS/$PROMPTS agree"* && $bench == *" 0 errors"* ]]; then
  verdict=PASS
fi
echo "validate_on_gpu: $verdict | TensorRT-LLM $version, $line | names $names | greedy $greedy with LLM.generate | bench: $bench | $WORK_DIR"
[[ $verdict == PASS ]]
