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
# Steps: (1) check every TensorRT-LLM name both executors use (`python -m
# plugins.trtllm.check_names`; engine mode is skipped on releases without it); (2) greedy
# reference outputs from TensorRT-LLM's own `LLM.generate`; (3) our gateway on the same
# model in LLM-API mode (`executor: {type: trtllm-llmapi}`), the same greedy requests
# through /v1/completions, compared token text for text; (4) `orchestrator bench` for
# about a minute (Poisson arrivals, 4 requests/s, 240 requests). It prints one summary
# line and exits 0 only if every step passed. Logs and results stay in $WORK_DIR
# (default: a new folder under /tmp).
set -euo pipefail

MODEL=${1:-TinyLlama/TinyLlama-1.1B-Chat-v1.0}
PORT=${2:-8011}
PYTHON=${PYTHON:-python3}
WORK_DIR=${WORK_DIR:-$(mktemp -d /tmp/validate-trtllm.XXXXXX)}
PROMPTS=8
MAX_TOKENS=24
mkdir -p "$WORK_DIR"
log() { echo "[validate] $*" >&2; }

if ! "$PYTHON" -c "import orchestrator, plugins.trtllm" 2>/dev/null; then
  log "the project is not importable: run 'pip install -e .' in the project root first"
  exit 2
fi

# ---------------------------------------------------------------- 1. names
log "1/4 checking TensorRT-LLM names (log: $WORK_DIR/names.log)"
names=FAIL
if "$PYTHON" -m plugins.trtllm.check_names >"$WORK_DIR/names.log" 2>&1; then
  names=OK
fi
tail -n 1 "$WORK_DIR/names.log" >&2

# ---------------------------------------------------------------- 2. references
log "2/4 greedy references from TensorRT-LLM's LLM.generate (log: $WORK_DIR/reference.log)"
"$PYTHON" - "$MODEL" "$WORK_DIR" "$PROMPTS" "$MAX_TOKENS" >"$WORK_DIR/reference.log" 2>&1 <<'PY'
import json, sys
from pathlib import Path

model, work, n, max_tokens = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if not Path(model).is_dir():
    from huggingface_hub import snapshot_download
    model = snapshot_download(model)
from transformers import AutoTokenizer
from tensorrt_llm import LLM, SamplingParams

texts = [
    "The capital of France is", "Paged attention stores the KV cache in",
    "In 1969 the first people to walk on the Moon were", "A haiku about GPUs:",
    "def fibonacci(n):", "The three primary colours are", "Water boils at",
    "The quick brown fox",
][:n]
tokenizer = AutoTokenizer.from_pretrained(model)
prompts = [tokenizer.encode(t) for t in texts]
llm = LLM(model=model, kv_cache_config={"free_gpu_memory_fraction": 0.5})
try:
    params = SamplingParams(max_tokens=max_tokens, top_k=1, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    refs = [list(o.outputs[0].token_ids) for o in outputs]
finally:
    llm.shutdown()
(work / "references.json").write_text(json.dumps({"model": model, "prompts": prompts, "tokens": refs}))
print(f"{len(refs)} references from {model}")
PY
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
greedy=$("$PYTHON" - "$WORK_DIR" "$PORT" "$MAX_TOKENS" <<'PY'
import json, sys, urllib.request
from pathlib import Path

work, port, max_tokens = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
ref = json.loads((work / "references.json").read_text())
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(ref["model"])
matched = 0
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
    expected = tokenizer.decode(tokens, skip_special_tokens=True)
    if text == expected:
        matched += 1
    else:
        print(f"MISMATCH {prompt[:8]}...\n  ours:         {text!r}\n  TensorRT-LLM: {expected!r}",
              file=sys.stderr)
print(f"{matched}/{len(ref['prompts'])}")
PY
) || greedy="0/$PROMPTS"
log "greedy outputs matching TensorRT-LLM's: $greedy"

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

version=$("$PYTHON" -c "import tensorrt_llm; print(tensorrt_llm.__version__)" 2>/dev/null || echo unknown)
verdict=FAIL
if [[ $names == OK && $greedy == "$PROMPTS/$PROMPTS" && $bench == *" 0 errors"* ]]; then
  verdict=PASS
fi
echo "validate_on_gpu: $verdict | TensorRT-LLM $version | names $names | greedy $greedy match LLM.generate | bench: $bench | $WORK_DIR"
[[ $verdict == PASS ]]
