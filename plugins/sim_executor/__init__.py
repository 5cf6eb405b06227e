"""Roofline simulator of a GPU deployment: executor type ``sim``."""

from orchestrator.core import StepCost
from plugins.sim_executor.config import SimExecutorConfig
from plugins.sim_executor.cost_model import CostModel
from plugins.sim_executor.executor import SimExecutor
from plugins.sim_executor.memory import DoesNotFitError, MemoryPlan, memory_plan

__all__ = [
    "CostModel",
    "DoesNotFitError",
    "MemoryPlan",
    "SimExecutor",
    "SimExecutorConfig",
    "StepCost",
    "memory_plan",
]
