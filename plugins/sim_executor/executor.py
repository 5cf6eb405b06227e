"""The ``sim`` executor: no model, synthetic tokens and a predicted step time."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from orchestrator.common.capacity import CapacityPlan
from orchestrator.common.cost_model import CostModel
from orchestrator.common.deployment import Deployment
from orchestrator.core import ExecutorInfo, SchedulerOutput, StepResult

if TYPE_CHECKING:
    from orchestrator.core import EngineConfig


class SimExecutor:
    """Answers each plan at once with a token per sampling request and the cost model's
    predicted duration.

    The token for a request whose last known token sits at position ``p`` is a pure
    function of ``p`` (skipping the request's stop ids), so outputs never depend on the
    batch and a request runs to ``max_tokens`` unless told otherwise. Every result
    carries its cost breakdown, so a driver can say where time went. It holds the KV
    blocks ``capacity`` leaves, of ``capacity.tokens_per_block`` tokens each.
    """

    Config: ClassVar[type[Deployment]] = Deployment

    def __init__(self, cost_model: CostModel, capacity: CapacityPlan) -> None:
        if capacity.kv_blocks < 1:
            raise ValueError(
                f"no KV block of {capacity.tokens_per_block} tokens fits next to the weights "
                f"and workspace ({capacity.kv_pool_bytes / 1e9:.2f} GB left for KV)"
            )
        self.cost_model = cost_model
        self.capacity = capacity
        self._vocab = cost_model.model.vocab_size
        self.max_model_len = cost_model.model.max_position_embeddings

    @classmethod
    def from_config(cls, config: Deployment, engine: EngineConfig) -> SimExecutor:
        """The deployment ``config`` with its workspace sized for ``engine``'s scheduler
        limits and its KV cache in blocks of ``engine.cache.block_size`` tokens; raises
        ``DoesNotFitError`` when the weights and workspace fill the GPUs."""
        return cls(config.cost_model(), config.capacity(engine.scheduler, engine.cache.block_size))

    def info(self) -> ExecutorInfo:
        """The capacity plan's KV blocks; the model's context limit; a cost breakdown on
        every step; ``tp`` GPUs per replica."""
        return ExecutorInfo(
            num_kv_blocks=self.capacity.kv_blocks,
            block_size=self.capacity.tokens_per_block,
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

    def shutdown(self) -> None:
        """Nothing to release."""
