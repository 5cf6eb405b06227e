"""The ``sim`` executor: no model, synthetic tokens and a predicted step time."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

from orchestrator.core import ExecutorInfo, SchedulerOutput, StepResult
from plugins.sim_executor.config import SimExecutorConfig
from plugins.sim_executor.cost_model import CostModel
from plugins.sim_executor.memory import MemoryPlan, memory_plan

if TYPE_CHECKING:
    from orchestrator.core import EngineConfig


class SimExecutor:
    """Answers each plan at once with a token per sampling request and the cost model's
    predicted duration.

    The token for a request whose last known token sits at position ``p`` is a pure
    function of ``p`` (skipping the request's stop ids), so outputs never depend on the
    batch and a request runs to ``max_tokens`` unless told otherwise. Every result
    carries its cost breakdown, so a driver can say where time went.
    """

    Config: ClassVar[type[SimExecutorConfig]] = SimExecutorConfig

    def __init__(self, cost_model: CostModel, memory: MemoryPlan, block_size: int) -> None:
        self.cost_model = cost_model
        self.memory = memory
        self.block_size = block_size
        self._num_blocks = memory.kv_blocks(block_size)
        if self._num_blocks < 1:
            raise ValueError(
                f"no KV block of {block_size} tokens fits next to the weights "
                f"({memory.kv_bytes / 1e9:.2f} GB left for KV)"
            )
        self._vocab = cost_model.model.vocab_size
        self.max_model_len = cost_model.model.max_position_embeddings

    @classmethod
    def from_config(cls, config: SimExecutorConfig, engine: EngineConfig) -> SimExecutor:
        model, gpu = config.model_spec(), config.gpu_spec()
        cost = CostModel(
            model,
            gpu,
            weight_dtype=config.weight_dtype,
            kv_dtype=config.kv_dtype,
            tp=config.tp,
            step_overhead_s=config.step_overhead_s,
            allreduce_latency_s=config.allreduce_latency_s,
            attention_efficiency=config.attention_efficiency,
        )
        memory = memory_plan(
            model,
            gpu,
            weight_dtype=config.weight_dtype,
            kv_dtype=config.kv_dtype,
            tp=config.tp,
            kv_memory_fraction=config.kv_memory_fraction,
        )
        return cls(cost, memory, engine.cache.block_size)

    def info(self) -> ExecutorInfo:
        """KV blocks of ``block_size`` tokens that fit beside the weights; the model's
        context limit; a cost breakdown on every step."""
        return ExecutorInfo(
            num_kv_blocks=self._num_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            reports_step_cost=True,
            num_gpus=self.cost_model.tp,
        )

    def execute(self, plan: SchedulerOutput) -> StepResult:
        cost = self.cost_model.step_cost(plan)
        vocab = self._vocab
        sampled: dict[str, int] = {}
        for s in plan.scheduled:
            if s.sample:
                token = (s.start_position + len(s.token_ids)) % vocab
                stops = s.sampling.stop_token_ids
                while token in stops:
                    token = (token + 1) % vocab
                sampled[s.request_id] = token
        return StepResult(sampled=sampled, duration_s=cost.total_s, cost=cost)

    def throughput_ceiling(
        self, max_batch_size: int, mean_prompt_len: float, mean_output_len: float
    ) -> float:
        """Output tokens/s of this replica decoding a full batch: as many requests as
        ``max_batch_size`` and the KV pool allow (each holding its whole prompt plus
        output), half-way through their outputs. Prefill is left out, so real schedules of
        this workload stay below it."""
        lifetime = math.ceil(mean_prompt_len + mean_output_len)
        fits = self.memory.max_sequences(lifetime, self.block_size)
        batch = max(1, min(max_batch_size, fits))
        return self.cost_model.decode_tokens_per_s(
            batch, round(mean_prompt_len + mean_output_len / 2)
        )

    def shutdown(self) -> None:
        """Nothing to release."""
