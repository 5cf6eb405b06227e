"""One case per validation rule: an override of the clean base spec that must trigger it."""

from __future__ import annotations

from typing import Any

import pytest

from build_engines.memory import plan_memory
from build_engines.validate import RULES, RuleInput, Severity, validate
from orchestrator.common.specs import load_gpu_spec, load_model_spec
from tests.build_engines.helpers import PYTORCH, make_spec

NO_PAGED_FMHA = {"plugins": {"use_paged_context_fmha": False}}

# rule id -> overrides of the base spec (Llama-3-70B FP8 TP2 on H100) that trigger it.
CASES: dict[str, list[dict[str, Any]]] = {
    "reduce-fusion-needs-tp": [{"parallelism": {"tp": 1}}],
    "user-buffer-needs-reduce-fusion": [{"plugins": {"user_buffer": True, "reduce_fusion": False}}],
    "user-buffer-needs-fp8": [
        {"plugins": {"user_buffer": True}, "quantization": {"weights": "bf16"}}
    ],
    "norm-quant-fusion-needs-nvfp4": [{"plugins": {"norm_quant_fusion": True}}],
    "context-fmha-off-drops-fp8-fmha": [{"plugins": {"context_fmha": False}}],
    "context-fmha-off-drops-paged-fmha": [
        {"plugins": {"context_fmha": False, "use_fp8_context_fmha": False}}
    ],
    "fp8-fmha-needs-fp8-weights": [{"quantization": {"weights": "bf16"}}],
    "paged-fmha-fp8-kv-needs-fp8-weights": [
        {"quantization": {"weights": "bf16"}, "plugins": {"use_fp8_context_fmha": False}}
    ],
    "fp8-needs-fp8-gpu": [{"target": {"gpu": "a100-80gb"}}],
    "fp8-fmha-needs-fp8-gpu": [{"target": {"gpu": "a100-80gb"}}],
    "paged-fmha-drops-fp8-fmha-without-fp8-kv": [{"quantization": {"kv_cache": "bf16"}}],
    "paged-fmha-fp8-kv-forces-fp8-fmha": [{"plugins": {"use_fp8_context_fmha": False}}],
    "paged-fmha-int8-kv": [{"quantization": {"kv_cache": "int8"}}],
    "max-input-len-clipped": [{"limits": {"max_input_len": 9000}}],
    "max-num-tokens-clamped": [
        {"limits": {"max_batch_size": 1, "max_seq_len": 4096, "max_input_len": 4096}}
    ],
    "max-num-tokens-below-block": [{"limits": {"max_num_tokens": 16, "max_batch_size": 8}}],
    "max-num-tokens-below-input-without-fmha": [
        {
            "plugins": {"context_fmha": False},
            "limits": {"max_num_tokens": 4096},
            "runtime": {"enable_chunked_context": False},
        }
    ],
    "tokens-per-block-power-of-two": [{"limits": {"tokens_per_block": 48}}],
    "max-num-tokens-large": [{"limits": {"max_num_tokens": 32768}}],
    "chunked-context-needs-engine-features": [NO_PAGED_FMHA],
    "block-reuse-needs-paged-fmha": [NO_PAGED_FMHA],
    "cuda-graph-cache-without-graphs": [{"runtime": {"cuda_graphs": False}}],
    "engine-rejects-pytorch-options": [{"runtime": {"cuda_graph_batch_sizes": [1, 2]}}],
    "pytorch-rejects-engine-options": [{"backend": "pytorch"}],
    "cuda-graph-batch-above-max": [PYTORCH, {"runtime": {"cuda_graph_batch_sizes": [1, 64]}}],
    "pytorch-int8-kv": [PYTORCH, {"quantization": {"kv_cache": "int8"}}],
    "prompt-over-token-budget": [
        {"limits": {"max_num_tokens": 4096}, "runtime": {"enable_chunked_context": False}}
    ],
    "batch-over-token-budget": [{"limits": {"max_num_tokens": 32}}],
    "unquantised-weights-follow-dtype": [
        {"quantization": {"weights": "bf16"}, "model": {"dtype": "float16"}}
    ],
    "unquantised-kv-follows-dtype": [
        {"quantization": {"kv_cache": "bf16"}, "model": {"dtype": "float16"}}
    ],
    "tp-divides-heads": [{"parallelism": {"tp": 3}}],
    "tp-and-kv-heads": [{"parallelism": {"tp": 3}}],
    "max-seq-len-over-model": [{"limits": {"max_seq_len": 16384}}],
    "hub-revision-required": [{"model": {"revision": None}}],
    "hub-revision-not-commit": [{"model": {"revision": "main"}}],
    "local-source-has-no-revision": [{"model": {"source": "/models/llama-3-70b"}}],
    "weights-fit": [{"parallelism": {"tp": 1}, "quantization": {"weights": "bf16"}}],
    "sequence-fits": [{"limits": {"max_seq_len": 500_000}}],
    "batch-fits-typical-context": [{"limits": {"max_batch_size": 256}}],
    "batch-unreachable-at-max-seq-len": [{"limits": {"max_batch_size": 128}}],
}

RULES_BY_ID = {rule.id: rule for rule in RULES}


def findings_for(*overrides: dict[str, Any]) -> list:
    spec = make_spec(*overrides)
    model, gpu = load_model_spec(spec.model.spec), load_gpu_spec(spec.target.gpu)
    return validate(RuleInput(spec, model, gpu, plan_memory(spec, model, gpu)))


def test_every_rule_has_a_case() -> None:
    assert set(CASES) == set(RULES_BY_ID)


def test_rule_ids_are_unique() -> None:
    assert len(RULES_BY_ID) == len(RULES)


def test_base_spec_is_clean() -> None:
    # Every case below is caused by its override, not by the base.
    assert findings_for() == []


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires(rule_id: str) -> None:
    rule = RULES_BY_ID[rule_id]
    hits = [f for f in findings_for(*CASES[rule_id]) if f.rule == rule_id]
    assert len(hits) == 1, f"{rule_id} did not fire"
    finding = hits[0]
    assert finding.severity == rule.severity
    assert finding.option == rule.option
    assert finding.message and finding.fix
    assert str(finding).startswith(f"{rule.severity}: {rule.option}: ")


def test_errors_come_before_warnings() -> None:
    # tp=3 gives errors; max_seq_len over the model's positions adds a warning.
    findings = findings_for({"parallelism": {"tp": 3}, "limits": {"max_seq_len": 16384}})
    severities = [f.severity for f in findings]
    assert Severity.WARNING in severities and Severity.ERROR in severities
    assert severities == sorted(severities, key=lambda s: s != Severity.ERROR)


def test_engine_rules_do_not_apply_to_pytorch() -> None:
    # reduce_fusion at tp=1 is a trtllm-build matter; the PyTorch backend has no such flag.
    ids = {f.rule for f in findings_for(PYTORCH, {"parallelism": {"tp": 1}})}
    assert "reduce-fusion-needs-tp" not in ids
    assert "pytorch-rejects-engine-options" not in ids


def test_chunked_context_fix_names_every_missing_feature() -> None:
    overrides = {
        "plugins": {
            "context_fmha": False,
            "use_fp8_context_fmha": False,
            "use_paged_context_fmha": False,
            "kv_cache_type": "continuous",
        },
        "runtime": {"enable_block_reuse": False},
    }
    (hit,) = [
        f for f in findings_for(overrides) if f.rule == "chunked-context-needs-engine-features"
    ]
    for needed in ("context_fmha: true", "kv_cache_type: paged", "use_paged_context_fmha: true"):
        assert needed in hit.fix
