"""Per-GPU memory plan of a build, computed before anything runs.

All quantities are bytes per GPU unless named otherwise. The plan is an estimate with
stated assumptions, so that an impossible batch size is caught on a laptop rather than
after a 40-minute build:

- Weights: the linear layers of the decoder (q, k, v, o, gate, up, down) are stored in the
  weight dtype and split across TP ranks; norms, the embedding table and the LM head stay
  in the activation dtype (quantize.py leaves them unquantised by default). The embedding
  table is replicated on every TP rank (TensorRT-LLM's default, no parallel embedding);
  the LM head is split. With PP the worst rank is counted as holding ``ceil(layers / pp)``
  layers plus both the embedding and the LM head, an upper bound.
- Workspace: ``runtime_reserve_bytes`` (CUDA context, NCCL and all-reduce buffers, cuBLAS
  workspaces, CUDA graphs) + activations for ``max_num_tokens`` tokens (the residual
  stream and the fused gate/up output, the widest pair live at once) + FP32 logits for
  the last token of ``max_batch_size`` sequences.
- KV cache: TensorRT-LLM gives the cache ``free_gpu_memory_fraction`` of the memory left
  after weights and workspace, in whole blocks of ``tokens_per_block`` tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from build_engines.spec import BuildSpec
from orchestrator.common.specs import DTYPE_BYTES, DType, GPUSpec, ModelSpec

# Our dtype names -> the shared table's dtype of the same width (the table lists only
# floating-point types; INT8 is as wide as FP8).
_SAME_WIDTH: dict[str, DType] = {"fp8": "fp8", "int8": "fp8", "bf16": "bf16", "fp16": "fp16"}
_ACTIVATION_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}
_LOGIT_BYTES = 4  # the runtime gathers logits in FP32


def _dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES[_SAME_WIDTH.get(dtype, dtype)]


@dataclass(frozen=True)
class MemoryPlan:
    """The numbers printed before a build (bytes per GPU, tokens, blocks, sequences)."""

    gpu_memory_bytes: int
    weight_bytes: int
    kv_bytes_per_token: int
    activation_bytes: int
    logits_bytes: int
    reserve_bytes: int
    kv_fraction: float
    kv_pool_bytes: int
    tokens_per_block: int
    kv_blocks: int
    max_seq_len: int
    typical_context_len: int
    max_batch_size: int

    @property
    def workspace_bytes(self) -> int:
        return self.reserve_bytes + self.activation_bytes + self.logits_bytes

    @property
    def free_after_weights_bytes(self) -> int:
        """Memory left for the KV cache before the fraction is applied (may be negative)."""
        return self.gpu_memory_bytes - self.weight_bytes - self.workspace_bytes

    @property
    def block_bytes(self) -> int:
        return self.tokens_per_block * self.kv_bytes_per_token

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds (whole blocks)."""
        return self.kv_blocks * self.tokens_per_block

    def blocks_for(self, context_len: int) -> int:
        """Blocks one sequence of ``context_len`` tokens occupies."""
        return -(-context_len // self.tokens_per_block)

    def sequences_at(self, context_len: int) -> int:
        """Sequences of ``context_len`` tokens whose KV fits at once."""
        return self.kv_blocks // self.blocks_for(context_len)

    @property
    def sequences_at_max_seq_len(self) -> int:
        return self.sequences_at(self.max_seq_len)

    @property
    def sequences_at_typical_context(self) -> int:
        return self.sequences_at(self.typical_context_len)


def weight_bytes_per_gpu(model: ModelSpec, spec: BuildSpec) -> int:
    """Weight bytes on the fullest GPU (see the module docstring for what is split)."""
    tp, pp = spec.parallelism.tp, spec.parallelism.pp
    wbytes = _dtype_bytes(spec.quantization.weights)
    abytes = _dtype_bytes(_ACTIVATION_DTYPE[spec.model.dtype])
    layers = math.ceil(model.num_layers / pp)
    norms_per_layer = 2 * model.hidden_size  # input and post-attention RMSNorm
    linear_per_layer = model.params_per_layer - norms_per_layer
    table = model.vocab_size * model.hidden_size
    linear = layers * linear_per_layer * wbytes / tp
    norms = (layers * norms_per_layer + model.hidden_size) * abytes  # + final norm
    embedding = table * abytes
    # A tied LM head is still materialised as its own (split) weight by TensorRT-LLM.
    lm_head = table * abytes / tp
    return math.ceil(linear + norms + embedding + lm_head)


def kv_bytes_per_token_per_gpu(model: ModelSpec, spec: BuildSpec) -> int:
    """Layers x 2 x KV heads x head dim x KV dtype size / TP, for the layers one PP rank
    holds. With TP above the KV head count each rank still holds one whole head."""
    tp = min(spec.parallelism.tp, model.num_kv_heads)
    all_layers = model.kv_bytes_per_token(_SAME_WIDTH[spec.quantization.kv_cache], tp)
    layers = math.ceil(model.num_layers / spec.parallelism.pp)
    return math.ceil(all_layers * layers / model.num_layers)


def plan_memory(spec: BuildSpec, model: ModelSpec, gpu: GPUSpec) -> MemoryPlan:
    """The memory plan of ``spec`` on ``gpu``."""
    tp = spec.parallelism.tp
    limits = spec.limits
    abytes = _dtype_bytes(_ACTIVATION_DTYPE[spec.model.dtype])
    weights = weight_bytes_per_gpu(model, spec)
    kv_per_token = kv_bytes_per_token_per_gpu(model, spec)
    per_token_activation = abytes * (
        2 * model.hidden_size + 2 * math.ceil(model.intermediate_size / tp)
    )
    activation = math.ceil(limits.max_num_tokens * per_token_activation)
    logits = limits.max_batch_size * math.ceil(model.vocab_size / tp) * _LOGIT_BYTES
    reserve = spec.memory.runtime_reserve_bytes
    memory = int(gpu.memory_bytes)
    free = memory - weights - reserve - activation - logits
    fraction = spec.runtime.kv_cache_free_gpu_memory_fraction
    # Exact decimal arithmetic, so 0.9 x N bytes does not round down by one byte.
    pool = max(0, math.floor(free * Fraction(str(fraction))))
    blocks = pool // (limits.tokens_per_block * kv_per_token)
    return MemoryPlan(
        gpu_memory_bytes=memory,
        weight_bytes=weights,
        kv_bytes_per_token=kv_per_token,
        activation_bytes=activation,
        logits_bytes=logits,
        reserve_bytes=reserve,
        kv_fraction=fraction,
        kv_pool_bytes=pool,
        tokens_per_block=limits.tokens_per_block,
        kv_blocks=blocks,
        max_seq_len=limits.max_seq_len,
        typical_context_len=spec.memory.typical_context_len,
        max_batch_size=limits.max_batch_size,
    )
