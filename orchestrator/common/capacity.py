"""The one capacity model: how the memory of each GPU of a replica divides between the
weights, the runtime's workspace and the paged KV cache.

The simulator's executor, ``orchestrator plan``, ``build-engines plan`` and the
TensorRT-LLM adapter's expected capacity all call ``capacity_plan``. All sizes are bytes
per GPU; ``tp`` GPUs split each layer, ``pp`` stages split the layers.

How TensorRT-LLM (1.2.x) accounts for memory, and so how we do:

1. Weights. The linear layers (q, k, v, o, gate, up, down) are split ``tp`` ways in the
   weight dtype; the norms stay replicated in the activation dtype. The embedding table
   and the LM head stay in the activation dtype (FP8 quantisation leaves them alone) and
   are split ``tp`` ways (``ceil(vocab / tp)`` rows per rank; the PyTorch backend splits
   the embedding by hidden columns instead, the same bytes for Llama shapes):
   - engine builds: our checkpoints come from ``examples/quantization/quantize.py``,
     which exports through ModelOpt, and ModelOpt writes ``use_parallel_embedding: True,
     embedding_sharding_dim: 0`` into the checkpoint config whatever the format
     (``modelopt/torch/export/tensorrt_llm_utils.py``, ``convert_to_tensorrt_llm_config``;
     ``full_prec`` goes the same way, ``tensorrt_llm/quantization/quantize_by_modelopt.py``).
     ``use_parallel_embedding=False`` (a replicated table) is only the default of the
     per-model ``convert_checkpoint.py`` scripts and of ``PretrainedConfig``
     (``tensorrt_llm/models/modeling_utils.py``), which our builds do not use.
   - PyTorch backend: ``LlamaModel.embed_tokens`` is an ``Embedding`` with
     ``TensorParallelMode.COLUMN`` (``tensorrt_llm/_torch/models/modeling_llama.py``)
     and the LM head an ``LMHead`` with ``TensorParallelMode.COLUMN,
     gather_output=True`` (``tensorrt_llm/_torch/models/modeling_utils.py``): both split.
   A tied LM head shares the table at ``pp == 1`` (``DecoderModelForCausalLM`` assigns
   ``lm_head.weight = embed_tokens.weight``; ModelOpt sets ``share_embedding_table``
   only without PP). With PP the fullest rank is counted as holding ``ceil(layers / pp)``
   layers plus both the embedding and the LM head, an upper bound.
2. Workspace, everything resident before the KV cache is sized: a fixed
   ``runtime_reserve_bytes`` (CUDA context, NCCL and all-reduce buffers, cuBLAS
   workspaces, CUDA graphs), activations for a full step of ``max_num_tokens`` tokens,
   and logits for ``max_batch_size`` sequences. The engine's execution context is sized
   for its largest profile (``max_num_tokens``), and the PyTorch backend measures peak
   memory over a forward pass of dummy context requests totalling ``max_num_tokens``
   tokens (``KvCacheCreator._create_dummy_context_requests`` and
   ``configure_kv_cache_capacity`` in ``tensorrt_llm/_torch/pyexecutor/_util.py``).
   Activations are estimated as the residual stream plus the fused gate/up output (the
   widest pair live at once). The LM head gathers its output (``gather_output=True``),
   so each rank holds the whole (padded) vocabulary's logits per sequence, counted in
   FP32, ``PretrainedConfig``'s default ``logits_dtype`` (ModelOpt checkpoints ask for
   float16, so for them this is an upper bound by ``max_batch_size x vocab x 2``).
3. KV cache: ``free_gpu_memory_fraction`` of the memory still free after 1 and 2. The
   C++ runtime takes ``free * fraction`` from ``cudaMemGetInfo`` once the engine is
   loaded (``BaseKVCacheManager::calculateFreeMemBytes`` in
   ``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``); the PyTorch backend takes
   ``(total - peak) * fraction`` (``KvCacheCreator._cal_max_memory``). Both then count
   whole tokens, ``pool // bytes_per_token``, and round *up* to blocks,
   ``ceil(tokens / tokens_per_block)`` (``BaseKVCacheManager::calculateMaxNumBlocks``;
   ``KVCacheManager.calculate_max_num_blocks`` in
   ``tensorrt_llm/_torch/pyexecutor/resource_manager.py``), so the last block may reach
   up to one block past the fraction.
4. KV bytes per token: layers on the rank x 2 (K and V) x KV heads on the rank x head
   dim x KV dtype size; the KV heads split across TP ranks until each rank holds one,
   beyond which they repeat (``ceil(kv_heads / tp)`` per rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from orchestrator.common.specs import DTYPE_BYTES, DType, GPUSpec, ModelSpec

# CUDA context, NCCL and all-reduce buffers, cuBLAS workspaces and CUDA graphs, per GPU:
# the builder's and the simulator's default estimate.
DEFAULT_RUNTIME_RESERVE_BYTES = 2_000_000_000

# Logits are counted in FP32 (module docstring, point 2).
LOGIT_BYTES = 4


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """Memory of each GPU of one replica (bytes), and the KV cache it leaves.

    ``kv_fraction`` is the share of the free memory the KV cache takes;
    ``kv_pool_bytes`` is that share in bytes and ``kv_blocks`` the blocks of
    ``tokens_per_block`` tokens TensorRT-LLM allocates from it. Every GPU of the replica
    holds the same ``kv_tokens`` tokens, each its share of the KV heads
    (``kv_bytes_per_token`` is per GPU).
    """

    gpu_memory_bytes: int
    weight_bytes: int
    reserve_bytes: int
    activation_bytes: int
    logits_bytes: int
    kv_fraction: float
    kv_pool_bytes: int
    kv_bytes_per_token: int
    tokens_per_block: int
    kv_blocks: int

    @property
    def workspace_bytes(self) -> int:
        """Runtime reserve + activations + logits."""
        return self.reserve_bytes + self.activation_bytes + self.logits_bytes

    @property
    def free_after_weights_bytes(self) -> int:
        """Memory left after weights and workspace, before the fraction is applied
        (negative when they do not fit)."""
        return self.gpu_memory_bytes - self.weight_bytes - self.workspace_bytes

    @property
    def fits(self) -> bool:
        """Whether weights and workspace leave any memory for the KV cache."""
        return self.free_after_weights_bytes > 0

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
        """Sequences of ``context_len`` tokens (prompt plus output) whose K/V fit at once,
        each rounded up to whole blocks."""
        return self.kv_blocks // self.blocks_for(context_len)


def weight_bytes_per_gpu(
    model: ModelSpec,
    *,
    weight_dtype: DType,
    activation_dtype: DType,
    tp: int = 1,
    pp: int = 1,
) -> int:
    """Weight bytes on the fullest GPU (module docstring, point 1)."""
    wbytes, abytes = DTYPE_BYTES[weight_dtype], DTYPE_BYTES[activation_dtype]
    layers = math.ceil(model.num_layers / pp)
    norms_per_layer = 2 * model.hidden_size  # input and post-attention RMSNorm
    linear_per_layer = model.params_per_layer - norms_per_layer
    linear = layers * linear_per_layer * wbytes / tp
    norms = (layers * norms_per_layer + model.hidden_size) * abytes  # + the final norm
    table = math.ceil(model.vocab_size / tp) * model.hidden_size * abytes
    lm_head = 0.0 if model.tie_word_embeddings and pp == 1 else table
    return math.ceil(linear + norms + table + lm_head)


def kv_bytes_per_token_per_gpu(
    model: ModelSpec, *, kv_dtype: DType, tp: int = 1, pp: int = 1
) -> int:
    """Layers on the rank x 2 (K, V) x KV heads on the rank x head dim x KV dtype size
    (module docstring, point 4)."""
    layers = math.ceil(model.num_layers / pp)
    heads = math.ceil(model.num_kv_heads / tp)
    return math.ceil(layers * 2 * heads * model.head_dim * DTYPE_BYTES[kv_dtype])


def capacity_plan(
    model: ModelSpec,
    gpu: GPUSpec,
    *,
    weight_dtype: DType,
    kv_dtype: DType,
    activation_dtype: DType,
    kv_memory_fraction: float,
    tokens_per_block: int,
    max_num_tokens: int,
    max_batch_size: int,
    tp: int = 1,
    pp: int = 1,
    runtime_reserve_bytes: int = DEFAULT_RUNTIME_RESERVE_BYTES,
) -> CapacityPlan:
    """The capacity of one replica of ``model`` on ``tp * pp`` GPUs of kind ``gpu``.

    ``max_num_tokens`` (tokens per step) and ``max_batch_size`` (sequences) size the
    workspace; ``kv_memory_fraction`` is TensorRT-LLM's ``free_gpu_memory_fraction``.
    Never raises for a deployment that does not fit: the plan then has ``fits`` false
    and an empty KV cache, so callers can say why.
    """
    if tp < 1 or pp < 1:
        raise ValueError(f"tp and pp must be at least 1, got tp={tp}, pp={pp}")
    abytes = DTYPE_BYTES[activation_dtype]
    weights = weight_bytes_per_gpu(
        model, weight_dtype=weight_dtype, activation_dtype=activation_dtype, tp=tp, pp=pp
    )
    per_token = kv_bytes_per_token_per_gpu(model, kv_dtype=kv_dtype, tp=tp, pp=pp)
    per_token_activation = abytes * (
        2 * model.hidden_size + 2 * math.ceil(model.intermediate_size / tp)
    )
    activation = math.ceil(max_num_tokens * per_token_activation)
    padded_vocab = math.ceil(model.vocab_size / tp) * tp
    logits = max_batch_size * padded_vocab * LOGIT_BYTES
    memory = int(gpu.memory_bytes)
    free = memory - weights - runtime_reserve_bytes - activation - logits
    # Exact decimal arithmetic, so 0.9 x N bytes does not round down by one byte.
    pool = max(0, math.floor(free * Fraction(str(kv_memory_fraction))))
    blocks = -(-(pool // per_token) // tokens_per_block)
    return CapacityPlan(
        gpu_memory_bytes=memory,
        weight_bytes=weights,
        reserve_bytes=runtime_reserve_bytes,
        activation_bytes=activation,
        logits_bytes=logits,
        kv_fraction=kv_memory_fraction,
        kv_pool_bytes=pool,
        kv_bytes_per_token=per_token,
        tokens_per_block=tokens_per_block,
        kv_blocks=blocks,
    )
