"""Validation rules: every option combination that ``trtllm-build`` (TensorRT-LLM 1.2.x)
silently overrides or rejects, and every run-time setting the engine cannot honour,
becomes a finding before anything runs.

Each rule is one small function over a ``RuleInput`` returning ``None`` (fine) or a
``(message, fix)`` pair; ``RULES`` is the table. Errors stop a build; warnings are
printed with the plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from build_engines.memory import BuildCapacity
from build_engines.spec import BuildSpec, PluginSection
from orchestrator.common.build_manifest import Backend
from orchestrator.common.specs import GPUSpec, ModelSpec


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class RuleInput:
    spec: BuildSpec
    model: ModelSpec
    gpu: GPUSpec
    memory: BuildCapacity

    @property
    def plugins(self) -> PluginSection:
        return self.spec.engine_plugins

    @property
    def fp8_weights(self) -> bool:
        return self.spec.quantization.weights == "fp8"

    @property
    def kv(self) -> str:
        return self.spec.quantization.kv_cache

    @property
    def gpu_has_fp8(self) -> bool:
        return self.gpu.fp8_flops is not None


@dataclass(frozen=True)
class Finding:
    """One problem with a spec: which rule, which option, why, and how to fix it."""

    rule: str
    severity: Severity
    option: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.option}: {self.message}. Fix: {self.fix}"


Check = Callable[[RuleInput], tuple[str, str] | None]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    option: str
    backends: frozenset[Backend]
    check: Check


ENGINE: frozenset[Backend] = frozenset({"engine"})
PYTORCH: frozenset[Backend] = frozenset({"pytorch"})
BOTH: frozenset[Backend] = frozenset({"engine", "pytorch"})

# --- trtllm-build silent overrides and hard errors ------------------------------------


def _reduce_fusion_needs_tp(r: RuleInput) -> tuple[str, str] | None:
    if r.plugins.reduce_fusion and r.spec.parallelism.tp == 1:
        return (
            "trtllm-build turns reduce_fusion off at tp=1 (there is no AllReduce to fuse)",
            "set plugins.reduce_fusion: false, or parallelism.tp >= 2",
        )
    return None


def _user_buffer_needs_reduce_fusion(r: RuleInput) -> tuple[str, str] | None:
    if r.plugins.user_buffer and not r.plugins.reduce_fusion:
        return (
            "trtllm-build turns user_buffer off when reduce_fusion is off",
            "set plugins.reduce_fusion: true (tp >= 2), or plugins.user_buffer: false",
        )
    return None


def _user_buffer_needs_fp8(r: RuleInput) -> tuple[str, str] | None:
    if r.plugins.user_buffer and not r.fp8_weights:
        return (
            "user buffers are supported only for FP8 Llama engines",
            "set quantization.weights: fp8, or plugins.user_buffer: false",
        )
    return None


def _norm_quant_fusion_needs_nvfp4(r: RuleInput) -> tuple[str, str] | None:
    if r.plugins.norm_quant_fusion:
        return (
            "trtllm-build turns norm_quant_fusion off unless the checkpoint is NVFP4, "
            "which this pipeline does not produce",
            "set plugins.norm_quant_fusion: false",
        )
    return None


def _context_fmha_off_drops_fp8_fmha(r: RuleInput) -> tuple[str, str] | None:
    if not r.plugins.context_fmha and r.plugins.use_fp8_context_fmha:
        return (
            "trtllm-build turns FP8 context FMHA off when context FMHA is off",
            "set plugins.context_fmha: true, or plugins.use_fp8_context_fmha: false",
        )
    return None


def _context_fmha_off_drops_paged_fmha(r: RuleInput) -> tuple[str, str] | None:
    if not r.plugins.context_fmha and r.plugins.use_paged_context_fmha:
        return (
            "trtllm-build turns paged context FMHA off when context FMHA is off",
            "set plugins.context_fmha: true, or plugins.use_paged_context_fmha: false",
        )
    return None


def _fp8_fmha_needs_fp8_weights(r: RuleInput) -> tuple[str, str] | None:
    if r.plugins.context_fmha and r.plugins.use_fp8_context_fmha and not r.fp8_weights:
        return (
            "trtllm-build turns FP8 context FMHA off unless the weights are FP8",
            "set quantization.weights: fp8, or plugins.use_fp8_context_fmha: false",
        )
    return None


def _paged_fmha_fp8_kv_needs_fp8_weights(r: RuleInput) -> tuple[str, str] | None:
    p = r.plugins
    if p.context_fmha and p.use_paged_context_fmha and r.kv == "fp8" and not r.fp8_weights:
        return (
            "trtllm-build turns paged context FMHA off for an FP8 KV cache when the "
            "weights are not FP8 (FP8 context FMHA is unavailable)",
            "set quantization.weights: fp8, or quantization.kv_cache: bf16",
        )
    return None


def _fp8_needs_fp8_gpu(r: RuleInput) -> tuple[str, str] | None:
    if (r.fp8_weights or r.kv == "fp8") and not r.gpu_has_fp8:
        return (
            f"{r.gpu.name} has no FP8 tensor cores (FP8 needs SM 8.9+, Ada or Hopper)",
            "use bf16 weights and KV cache, or target an FP8-capable GPU",
        )
    return None


def _fp8_fmha_needs_fp8_gpu(r: RuleInput) -> tuple[str, str] | None:
    p = r.plugins
    if p.context_fmha and p.use_fp8_context_fmha and r.fp8_weights and not r.gpu_has_fp8:
        return (
            f"trtllm-build turns FP8 context FMHA off on {r.gpu.name} (needs SM 8.9+)",
            "set plugins.use_fp8_context_fmha: false, or target an FP8-capable GPU",
        )
    return None


def _paged_fmha_drops_fp8_fmha_without_fp8_kv(r: RuleInput) -> tuple[str, str] | None:
    p = r.plugins
    if (
        p.context_fmha
        and p.use_paged_context_fmha
        and p.use_fp8_context_fmha
        and r.fp8_weights
        and r.gpu_has_fp8
        and r.kv != "fp8"
    ):
        return (
            "with paged context FMHA, trtllm-build turns FP8 context FMHA off unless the "
            "KV cache is FP8",
            "set quantization.kv_cache: fp8, or plugins.use_fp8_context_fmha: false",
        )
    return None


def _paged_fmha_fp8_kv_forces_fp8_fmha(r: RuleInput) -> tuple[str, str] | None:
    p = r.plugins
    if (
        p.context_fmha
        and p.use_paged_context_fmha
        and not p.use_fp8_context_fmha
        and r.fp8_weights
        and r.gpu_has_fp8
        and r.kv == "fp8"
    ):
        return (
            "with paged context FMHA and an FP8 KV cache, trtllm-build turns FP8 context "
            "FMHA on regardless",
            "set plugins.use_fp8_context_fmha: true",
        )
    return None


def _paged_fmha_int8_kv(r: RuleInput) -> tuple[str, str] | None:
    if r.plugins.use_paged_context_fmha and r.kv == "int8":
        return (
            "trtllm-build turns paged context FMHA off with an INT8 KV cache",
            "set quantization.kv_cache: fp8, or plugins.use_paged_context_fmha: false",
        )
    return None


def _max_input_len_clipped(r: RuleInput) -> tuple[str, str] | None:
    lim = r.spec.limits
    if lim.max_input_len > lim.max_seq_len:
        return (
            f"trtllm-build clips max_input_len ({lim.max_input_len}) to max_seq_len "
            f"({lim.max_seq_len})",
            f"set limits.max_input_len <= {lim.max_seq_len}",
        )
    return None


def _max_num_tokens_clamped(r: RuleInput) -> tuple[str, str] | None:
    lim = r.spec.limits
    cap = lim.max_seq_len * lim.max_batch_size
    if lim.max_num_tokens > cap:
        return (
            f"trtllm-build lowers max_num_tokens ({lim.max_num_tokens}) to "
            f"max_seq_len x max_batch_size ({cap})",
            f"set limits.max_num_tokens <= {cap}",
        )
    return None


def _max_num_tokens_below_block(r: RuleInput) -> tuple[str, str] | None:
    lim = r.spec.limits
    if r.plugins.context_fmha and lim.max_num_tokens < lim.tokens_per_block:
        return (
            f"trtllm-build raises max_num_tokens ({lim.max_num_tokens}) to "
            f"tokens_per_block ({lim.tokens_per_block})",
            f"set limits.max_num_tokens >= {lim.tokens_per_block}",
        )
    return None


def _max_num_tokens_below_input_without_fmha(r: RuleInput) -> tuple[str, str] | None:
    lim = r.spec.limits
    if not r.plugins.context_fmha and lim.max_num_tokens < lim.max_input_len:
        return (
            f"without context FMHA, trtllm-build raises max_num_tokens "
            f"({lim.max_num_tokens}) to max_input_len ({lim.max_input_len})",
            f"set limits.max_num_tokens >= {lim.max_input_len}, or plugins.context_fmha: true",
        )
    return None


def _tokens_per_block_power_of_two(r: RuleInput) -> tuple[str, str] | None:
    n = r.spec.limits.tokens_per_block
    if n & (n - 1):
        lower = 1 << (n.bit_length() - 1)
        return (
            f"tokens_per_block ({n}) must be a power of 2 for the paged KV cache",
            f"set limits.tokens_per_block to {lower} or {lower * 2}",
        )
    return None


def _max_num_tokens_large(r: RuleInput) -> tuple[str, str] | None:
    n = r.spec.limits.max_num_tokens
    if n > 16384:
        return (
            f"max_num_tokens {n} > 16384 brings no speed-up and can exceed TensorRT's "
            "tensor volume limit at run time",
            "set limits.max_num_tokens to 16384 or less",
        )
    return None


# --- run-time settings the engine must support -----------------------------------------


def _chunked_context_needs_engine_features(r: RuleInput) -> tuple[str, str] | None:
    if not r.spec.runtime.enable_chunked_context:
        return None
    p = r.plugins
    missing = [
        name
        for name, ok in (
            ("plugins.context_fmha: true", p.context_fmha),
            ("plugins.kv_cache_type: paged", p.kv_cache_type == "paged"),
            ("plugins.use_paged_context_fmha: true", p.use_paged_context_fmha),
        )
        if not ok
    ]
    if missing:
        return (
            "chunked context at run time needs context FMHA, a paged KV cache and paged "
            "context FMHA in the engine",
            f"set {', '.join(missing)}; or runtime.enable_chunked_context: false",
        )
    return None


def _block_reuse_needs_paged_fmha(r: RuleInput) -> tuple[str, str] | None:
    p = r.plugins
    if r.spec.runtime.enable_block_reuse and not (
        p.use_paged_context_fmha and p.kv_cache_type == "paged"
    ):
        return (
            "KV block reuse needs a paged KV cache and paged context FMHA in the engine",
            "set plugins.use_paged_context_fmha: true and plugins.kv_cache_type: paged; "
            "or runtime.enable_block_reuse: false",
        )
    return None


def _cuda_graph_cache_without_graphs(r: RuleInput) -> tuple[str, str] | None:
    rt = r.spec.runtime
    if rt.cuda_graph_cache_size and not rt.cuda_graphs:
        return (
            "cuda_graph_cache_size has no effect with CUDA graphs off",
            "set runtime.cuda_graphs: true, or remove runtime.cuda_graph_cache_size",
        )
    return None


def _engine_rejects_pytorch_options(r: RuleInput) -> tuple[str, str] | None:
    rt = r.spec.runtime
    given = [
        f"runtime.{k}"
        for k, v in (
            ("cuda_graph_batch_sizes", rt.cuda_graph_batch_sizes),
            ("cuda_graph_padding", rt.cuda_graph_padding),
        )
        if v is not None
    ]
    if given:
        return (
            f"{', '.join(given)} apply only to backend: pytorch (engine CUDA graphs are "
            "captured per batch shape at run time)",
            "remove them, or use runtime.cuda_graph_cache_size",
        )
    return None


def _pytorch_rejects_engine_options(r: RuleInput) -> tuple[str, str] | None:
    given = []
    if r.spec.plugins is not None:
        given.append("plugins")
    if r.spec.runtime.cuda_graph_cache_size is not None:
        given.append("runtime.cuda_graph_cache_size")
    if given:
        return (
            f"{', '.join(given)} apply only to backend: engine",
            "remove them (the PyTorch backend has no trtllm-build step)",
        )
    return None


def _cuda_graph_batch_above_max(r: RuleInput) -> tuple[str, str] | None:
    sizes = r.spec.runtime.cuda_graph_batch_sizes or []
    too_big = [s for s in sizes if s > r.spec.limits.max_batch_size]
    if too_big:
        return (
            f"CUDA graph batch sizes {too_big} exceed max_batch_size "
            f"({r.spec.limits.max_batch_size}): they are captured but never replayed",
            f"remove them or raise limits.max_batch_size to {max(too_big)}",
        )
    return None


def _prompt_over_token_budget(r: RuleInput) -> tuple[str, str] | None:
    lim = r.spec.limits
    if not r.spec.runtime.enable_chunked_context and lim.max_input_len > lim.max_num_tokens:
        return (
            f"without chunked context a prompt runs in one step, so prompts over "
            f"max_num_tokens ({lim.max_num_tokens}) up to max_input_len "
            f"({lim.max_input_len}) can never be scheduled",
            f"set runtime.enable_chunked_context: true, or limits.max_num_tokens >= "
            f"{lim.max_input_len}",
        )
    return None


def _batch_over_token_budget(r: RuleInput) -> tuple[str, str] | None:
    lim = r.spec.limits
    if lim.max_batch_size > lim.max_num_tokens:
        return (
            f"max_batch_size ({lim.max_batch_size}) is unreachable: every running "
            f"sequence needs one token of the max_num_tokens ({lim.max_num_tokens}) budget",
            f"set limits.max_batch_size <= {lim.max_num_tokens}",
        )
    return None


def _pytorch_int8_kv(r: RuleInput) -> tuple[str, str] | None:
    if r.kv == "int8":
        return (
            "the PyTorch backend's KV cache is FP8 or the model dtype; it has no INT8 mode",
            "set quantization.kv_cache: fp8",
        )
    return None


# --- model, parallelism and source -----------------------------------------------------


_DTYPE_NAME = {"bf16": "bfloat16", "fp16": "float16"}


def _unquantised_weights_follow_dtype(r: RuleInput) -> tuple[str, str] | None:
    w, dtype = r.spec.quantization.weights, r.spec.model.dtype
    if w in _DTYPE_NAME and _DTYPE_NAME[w] != dtype:
        return (
            f"unquantised weights are exported in model.dtype ({dtype}), not {w}",
            f"set quantization.weights: fp8, or model.dtype: {_DTYPE_NAME[w]}",
        )
    return None


def _unquantised_kv_follows_dtype(r: RuleInput) -> tuple[str, str] | None:
    dtype = r.spec.model.dtype
    if r.kv in _DTYPE_NAME and _DTYPE_NAME[r.kv] != dtype:
        return (
            f"an unquantised KV cache is kept in model.dtype ({dtype}), not {r.kv}",
            f"set quantization.kv_cache: fp8, or model.dtype: {_DTYPE_NAME[r.kv]}",
        )
    return None


def _tp_divides_heads(r: RuleInput) -> tuple[str, str] | None:
    tp, heads = r.spec.parallelism.tp, r.model.num_heads
    if heads % tp:
        return (
            f"tp={tp} does not divide the {heads} attention heads of {r.model.name}",
            "choose parallelism.tp among the divisors of the head count",
        )
    return None


def _tp_and_kv_heads(r: RuleInput) -> tuple[str, str] | None:
    tp, kv = r.spec.parallelism.tp, r.model.num_kv_heads
    if kv % tp and tp % kv:
        return (
            f"tp={tp} neither divides nor is a multiple of the {kv} KV heads of {r.model.name}",
            "choose parallelism.tp that divides, or is a multiple of, the KV head count",
        )
    return None


def _max_seq_len_over_model(r: RuleInput) -> tuple[str, str] | None:
    n, limit = r.spec.limits.max_seq_len, r.model.max_position_embeddings
    if n > limit:
        return (
            f"max_seq_len ({n}) exceeds the {limit} positions {r.model.name} was trained "
            "for; quality degrades past them",
            f"set limits.max_seq_len <= {limit}",
        )
    return None


def _hub_revision_required(r: RuleInput) -> tuple[str, str] | None:
    m = r.spec.model
    if not m.is_local and m.revision is None:
        return (
            f"no revision for Hub model {m.source}: the build would follow whatever the "
            "default branch holds on the day it runs",
            "set model.revision to a commit hash",
        )
    return None


def _hub_revision_not_commit(r: RuleInput) -> tuple[str, str] | None:
    m = r.spec.model
    if not m.is_local and m.revision is not None and not m.revision_is_commit:
        return (
            f"revision {m.revision!r} is a branch or tag and can move; the commit it "
            "resolves to is recorded in the manifest",
            "set model.revision to the 40-character commit hash for reproducible builds",
        )
    return None


def _local_source_has_no_revision(r: RuleInput) -> tuple[str, str] | None:
    m = r.spec.model
    if m.is_local and m.revision is not None:
        return (
            f"revision {m.revision!r} cannot apply to the local folder {m.source}",
            "remove model.revision",
        )
    return None


# --- memory plan ------------------------------------------------------------------------


def _weights_fit(r: RuleInput) -> tuple[str, str] | None:
    m = r.memory
    if m.free_after_weights_bytes <= 0:
        return (
            f"weights ({m.weight_bytes / 1e9:.1f} GB) and workspace "
            f"({m.workspace_bytes / 1e9:.1f} GB) exceed the {m.gpu_memory_bytes / 1e9:.0f} GB "
            f"of {r.gpu.name}",
            "raise parallelism.tp, quantise the weights to fp8, or lower limits.max_num_tokens",
        )
    return None


def _sequence_fits(r: RuleInput) -> tuple[str, str] | None:
    m = r.memory
    if m.free_after_weights_bytes > 0 and m.sequences_at_max_seq_len == 0:
        return (
            f"the KV cache ({m.kv_tokens} tokens) cannot hold one sequence of "
            f"max_seq_len ({m.max_seq_len}) tokens",
            f"set limits.max_seq_len <= {m.kv_tokens}, raise the KV fraction, or raise "
            "parallelism.tp",
        )
    return None


def _batch_fits_typical_context(r: RuleInput) -> tuple[str, str] | None:
    m = r.memory
    fits = m.sequences_at_typical_context
    if m.sequences_at_max_seq_len > 0 and m.max_batch_size > fits:
        return (
            f"max_batch_size ({m.max_batch_size}) sequences of {m.typical_context_len} "
            f"tokens need {m.max_batch_size * m.blocks_for(m.typical_context_len)} KV "
            f"blocks; the cache holds {m.kv_blocks}",
            f"set limits.max_batch_size <= {fits}, lower memory.typical_context_len, or "
            "raise parallelism.tp or runtime.kv_cache_free_gpu_memory_fraction",
        )
    return None


def _batch_unreachable_at_max_seq_len(r: RuleInput) -> tuple[str, str] | None:
    m = r.memory
    at_max = m.sequences_at_max_seq_len
    if 0 < at_max < m.max_batch_size <= m.sequences_at_typical_context:
        longest = m.kv_tokens // m.max_batch_size
        return (
            f"max_batch_size ({m.max_batch_size}) is reachable only while sequences "
            f"average <= {longest:,} tokens; at max_seq_len ({m.max_seq_len}) only {at_max} "
            "fit",
            "expected for mixed traffic; lower limits.max_batch_size to "
            f"{at_max} to guarantee it at max_seq_len",
        )
    return None


E, W = Severity.ERROR, Severity.WARNING

RULES: tuple[Rule, ...] = (
    Rule("reduce-fusion-needs-tp", E, "plugins.reduce_fusion", ENGINE, _reduce_fusion_needs_tp),
    Rule(
        "user-buffer-needs-reduce-fusion",
        E,
        "plugins.user_buffer",
        ENGINE,
        _user_buffer_needs_reduce_fusion,
    ),
    Rule("user-buffer-needs-fp8", E, "plugins.user_buffer", ENGINE, _user_buffer_needs_fp8),
    Rule(
        "norm-quant-fusion-needs-nvfp4",
        E,
        "plugins.norm_quant_fusion",
        ENGINE,
        _norm_quant_fusion_needs_nvfp4,
    ),
    Rule(
        "context-fmha-off-drops-fp8-fmha",
        E,
        "plugins.use_fp8_context_fmha",
        ENGINE,
        _context_fmha_off_drops_fp8_fmha,
    ),
    Rule(
        "context-fmha-off-drops-paged-fmha",
        E,
        "plugins.use_paged_context_fmha",
        ENGINE,
        _context_fmha_off_drops_paged_fmha,
    ),
    Rule(
        "fp8-fmha-needs-fp8-weights",
        E,
        "plugins.use_fp8_context_fmha",
        ENGINE,
        _fp8_fmha_needs_fp8_weights,
    ),
    Rule(
        "paged-fmha-fp8-kv-needs-fp8-weights",
        E,
        "plugins.use_paged_context_fmha",
        ENGINE,
        _paged_fmha_fp8_kv_needs_fp8_weights,
    ),
    Rule("fp8-needs-fp8-gpu", E, "quantization", BOTH, _fp8_needs_fp8_gpu),
    Rule(
        "fp8-fmha-needs-fp8-gpu",
        E,
        "plugins.use_fp8_context_fmha",
        ENGINE,
        _fp8_fmha_needs_fp8_gpu,
    ),
    Rule(
        "paged-fmha-drops-fp8-fmha-without-fp8-kv",
        E,
        "plugins.use_fp8_context_fmha",
        ENGINE,
        _paged_fmha_drops_fp8_fmha_without_fp8_kv,
    ),
    Rule(
        "paged-fmha-fp8-kv-forces-fp8-fmha",
        E,
        "plugins.use_fp8_context_fmha",
        ENGINE,
        _paged_fmha_fp8_kv_forces_fp8_fmha,
    ),
    Rule(
        "paged-fmha-int8-kv",
        E,
        "plugins.use_paged_context_fmha",
        ENGINE,
        _paged_fmha_int8_kv,
    ),
    Rule("max-input-len-clipped", E, "limits.max_input_len", BOTH, _max_input_len_clipped),
    Rule("max-num-tokens-clamped", E, "limits.max_num_tokens", ENGINE, _max_num_tokens_clamped),
    Rule(
        "max-num-tokens-below-block",
        E,
        "limits.max_num_tokens",
        ENGINE,
        _max_num_tokens_below_block,
    ),
    Rule(
        "max-num-tokens-below-input-without-fmha",
        E,
        "limits.max_num_tokens",
        ENGINE,
        _max_num_tokens_below_input_without_fmha,
    ),
    Rule(
        "tokens-per-block-power-of-two",
        E,
        "limits.tokens_per_block",
        BOTH,
        _tokens_per_block_power_of_two,
    ),
    Rule("max-num-tokens-large", W, "limits.max_num_tokens", BOTH, _max_num_tokens_large),
    Rule(
        "chunked-context-needs-engine-features",
        E,
        "runtime.enable_chunked_context",
        ENGINE,
        _chunked_context_needs_engine_features,
    ),
    Rule(
        "block-reuse-needs-paged-fmha",
        E,
        "runtime.enable_block_reuse",
        ENGINE,
        _block_reuse_needs_paged_fmha,
    ),
    Rule(
        "cuda-graph-cache-without-graphs",
        E,
        "runtime.cuda_graph_cache_size",
        ENGINE,
        _cuda_graph_cache_without_graphs,
    ),
    Rule("engine-rejects-pytorch-options", E, "runtime", ENGINE, _engine_rejects_pytorch_options),
    Rule("pytorch-rejects-engine-options", E, "backend", PYTORCH, _pytorch_rejects_engine_options),
    Rule(
        "cuda-graph-batch-above-max",
        E,
        "runtime.cuda_graph_batch_sizes",
        PYTORCH,
        _cuda_graph_batch_above_max,
    ),
    Rule("prompt-over-token-budget", E, "limits.max_num_tokens", BOTH, _prompt_over_token_budget),
    Rule("batch-over-token-budget", W, "limits.max_batch_size", BOTH, _batch_over_token_budget),
    Rule("pytorch-int8-kv", E, "quantization.kv_cache", PYTORCH, _pytorch_int8_kv),
    Rule(
        "unquantised-weights-follow-dtype",
        E,
        "quantization.weights",
        BOTH,
        _unquantised_weights_follow_dtype,
    ),
    Rule(
        "unquantised-kv-follows-dtype",
        E,
        "quantization.kv_cache",
        BOTH,
        _unquantised_kv_follows_dtype,
    ),
    Rule("tp-divides-heads", E, "parallelism.tp", BOTH, _tp_divides_heads),
    Rule("tp-and-kv-heads", E, "parallelism.tp", BOTH, _tp_and_kv_heads),
    Rule("max-seq-len-over-model", W, "limits.max_seq_len", BOTH, _max_seq_len_over_model),
    Rule("hub-revision-required", E, "model.revision", BOTH, _hub_revision_required),
    Rule("hub-revision-not-commit", W, "model.revision", BOTH, _hub_revision_not_commit),
    Rule(
        "local-source-has-no-revision",
        E,
        "model.revision",
        BOTH,
        _local_source_has_no_revision,
    ),
    Rule("weights-fit", E, "parallelism.tp", BOTH, _weights_fit),
    Rule("sequence-fits", E, "limits.max_seq_len", BOTH, _sequence_fits),
    Rule(
        "batch-fits-typical-context",
        E,
        "limits.max_batch_size",
        BOTH,
        _batch_fits_typical_context,
    ),
    Rule(
        "batch-unreachable-at-max-seq-len",
        W,
        "limits.max_batch_size",
        BOTH,
        _batch_unreachable_at_max_seq_len,
    ),
)


def validate(r: RuleInput, rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    """Every finding of ``rules`` that apply to the spec's backend, errors first."""
    findings = []
    for rule in rules:
        if r.spec.backend not in rule.backends:
            continue
        hit = rule.check(r)
        if hit is not None:
            message, fix = hit
            findings.append(Finding(rule.id, rule.severity, rule.option, message, fix))
    return sorted(findings, key=lambda f: f.severity != Severity.ERROR)
