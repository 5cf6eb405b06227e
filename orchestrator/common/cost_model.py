"""Roofline cost model of one engine step on one tensor-parallel group of GPUs.

A step is one forward pass over a mixed batch (prefill chunks and decode tokens). It
runs as two kinds of kernels, each bound by whichever of memory and compute is slower:

- dense (the linear layers and the LM head): the weights stream from HBM once per
  step whatever the batch, against ``2 x parameters`` FLOPs per token;
- attention: each scheduled request's cached context is read once (a fused attention
  kernel streams a request's K/V once per step) and its new K/V written, against
  ``4 x heads x head_dim`` FLOPs per layer for every (query, attended position) pair.

Tensor parallelism adds two all-reduces of the activations per layer; a fixed overhead
covers kernel launches, scheduling and sampling. ``attention_efficiency`` scales the
attention kernels' share of the peaks relative to the dense kernels' (1.0 by default;
calibration fits it). All times are seconds, sizes bytes,
rates per second, and every figure is per GPU (each holds ``1/tp`` of the work).
"""

from __future__ import annotations

from orchestrator.common.capacity import kv_bytes_per_token_per_gpu
from orchestrator.common.specs import DTYPE_BYTES, DType, GPUSpec, ModelSpec
from orchestrator.core import SchedulerOutput, StepCost, StepFeatures, features_of

# Activations cross the interconnect in 16-bit whatever the weight format.
ACTIVATION_BYTES = 2.0


def _compute_dtype(gpu: GPUSpec, storage: DType) -> DType:
    """FP8 (or int8) data runs on FP8 tensor cores where the GPU has them; elsewhere it
    is dequantised and multiplied in BF16 (weight-only FP8, as on A100; weight-only int8,
    as the torch executor's CPU kernels widen it)."""
    if storage in ("fp8", "int8") and gpu.fp8_flops is None:
        return "bf16"
    return storage


class CostModel:
    """Predicts step times for ``model`` on ``tp`` GPUs of kind ``gpu``.

    Per-step work is a few additions per scheduled request; every constant is folded
    at construction so that simulating a step costs microseconds.
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        *,
        weight_dtype: DType = "bf16",
        kv_dtype: DType = "bf16",
        tp: int = 1,
        step_overhead_s: float = 0.0,
        allreduce_latency_s: float = 0.0,
        attention_efficiency: float = 1.0,
    ) -> None:
        if tp < 1:
            raise ValueError(f"tp must be at least 1, got {tp}")
        if attention_efficiency <= 0:
            raise ValueError(f"attention_efficiency must be positive, got {attention_efficiency}")
        self.model = model
        self.gpu = gpu
        self.weight_dtype = weight_dtype
        self.kv_dtype = kv_dtype
        self.tp = tp
        self.step_overhead_s = step_overhead_s
        self.allreduce_latency_s = allreduce_latency_s

        self.bandwidth = gpu.hbm_bw * gpu.bw_efficiency
        self.dense_flops_rate = gpu.flops(_compute_dtype(gpu, weight_dtype)) * gpu.flops_efficiency
        # Attention kernels reach a smaller share of the peaks than GEMMs do (gathers,
        # softmax, short rows), in both their memory traffic and their FLOPs.
        self.kv_bandwidth = self.bandwidth * attention_efficiency
        self.attention_flops_rate = (
            gpu.flops(_compute_dtype(gpu, kv_dtype)) * gpu.flops_efficiency * attention_efficiency
        )

        h = model.hidden_size
        embed = model.vocab_size * h
        # An untied embedding table is gathered row by row, never streamed whole; a tied
        # one is streamed as the LM head anyway.
        streamed = model.num_params - (0 if model.tie_word_embeddings else embed)
        self.weight_bytes = streamed * DTYPE_BYTES[weight_dtype] / tp
        self.layer_flops_per_token = 2.0 * model.num_layers * model.params_per_layer / tp
        self.head_flops_per_sample = 2.0 * embed / tp
        # QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add, per head, per layer.
        self.attention_flops_per_pair = (
            4.0 * model.num_layers * model.num_heads * model.head_dim / tp
        )
        # What each GPU's attention reads per cached token: its share of the KV heads.
        self.kv_bytes_per_token = kv_bytes_per_token_per_gpu(model, kv_dtype=kv_dtype, tp=tp)
        if tp > 1:
            ring = 2.0 * (tp - 1) / tp
            self.comms_s_per_token = (
                2 * model.num_layers * ring * h * ACTIVATION_BYTES / gpu.interconnect_bw
            )
            self.comms_s_fixed = 2 * model.num_layers * allreduce_latency_s
        else:
            self.comms_s_per_token = 0.0
            self.comms_s_fixed = 0.0
        self.weights_s = self.weight_bytes / self.bandwidth

    def step_cost(self, plan: SchedulerOutput) -> StepCost:
        """Breakdown of the time ``plan`` takes. An empty plan costs nothing."""
        return self.features_cost(features_of(plan))

    def features_cost(self, f: StepFeatures) -> StepCost:
        """Breakdown of a step with features ``f``; ``step_cost`` is this of its plan's
        features, so the simulator's step-time predictor is exact."""
        if not f.num_seqs:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        return self._cost(f.num_tokens, f.num_samples, f.context_tokens, f.attention_pairs)

    def predict_s(self, f: StepFeatures) -> float:
        """Seconds a step with features ``f`` takes."""
        return self.features_cost(f).total_s

    def _cost(self, tokens: int, samples: int, context: int, pairs: int) -> StepCost:
        dense_flops = tokens * self.layer_flops_per_token + samples * self.head_flops_per_sample
        return StepCost(
            weights_s=self.weights_s,
            kv_s=(context + tokens) * self.kv_bytes_per_token / self.kv_bandwidth,
            dense_compute_s=dense_flops / self.dense_flops_rate,
            attention_compute_s=pairs * self.attention_flops_per_pair / self.attention_flops_rate,
            comms_s=self.comms_s_fixed + tokens * self.comms_s_per_token,
            overhead_s=self.step_overhead_s,
        )

    def decode_cost(self, batch_size: int, context_len: int) -> StepCost:
        """A decode step of ``batch_size`` requests, each with ``context_len`` tokens
        already cached."""
        pairs = batch_size * (context_len + 1)
        return self._cost(batch_size, batch_size, batch_size * context_len, pairs)

    def prefill_cost(self, num_tokens: int, start_position: int = 0) -> StepCost:
        """One request's prefill chunk of ``num_tokens`` starting at ``start_position``,
        sampling at its end."""
        n, p = num_tokens, start_position
        return self._cost(n, 1, p, n * p + n * (n + 1) // 2)

    def decode_tokens_per_s(self, batch_size: int, context_len: int = 0) -> float:
        """Output tokens per second of a steady decode batch (per TP group)."""
        return batch_size / self.decode_cost(batch_size, context_len).total_s

    def crossover_batch_size(self) -> float:
        """Decode batch at which the dense FLOPs take as long as streaming the weights:
        below it decode is memory-bound. Attention is left out, as in the usual
        back-of-envelope (it is a per-request cost that does not amortise)."""
        flops_per_token = self.layer_flops_per_token + self.head_flops_per_sample
        return self.weights_s * self.dense_flops_rate / flops_per_token
