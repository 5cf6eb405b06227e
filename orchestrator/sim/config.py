"""A simulation file: the engine to simulate, the traffic, the cluster and the SLO.

``engine`` is an ordinary engine config (the same sections ``orchestrator serve``
reads), usually with ``executor: {type: sim, ...}``; any executor works, since the
driver only needs each step's duration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from orchestrator.common.metrics import SLO
from orchestrator.common.workloads import WorkloadConfig
from orchestrator.core import EngineConfig, StrictModel, load_yaml

RouterName = Literal["round_robin", "least_outstanding_tokens", "prefix_aware"]


class ClusterConfig(StrictModel):
    """``replicas`` identical engines (each of ``ExecutorInfo.num_gpus`` GPUs) behind one
    router."""

    replicas: int = Field(1, ge=1)
    router: RouterName = "least_outstanding_tokens"


class SLOConfig(StrictModel):
    """Latency objectives in milliseconds; ``None`` leaves a metric unbounded."""

    ttft_ms: float | None = Field(500.0, gt=0)
    tpot_ms: float | None = Field(80.0, gt=0)

    def to_slo(self) -> SLO:
        return SLO(
            ttft_s=None if self.ttft_ms is None else self.ttft_ms / 1e3,
            tpot_s=None if self.tpot_ms is None else self.tpot_ms / 1e3,
        )


class SimConfig(StrictModel):
    engine: EngineConfig
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    slo: SLOConfig = Field(default_factory=SLOConfig)


def load_sim_config(path: str | Path) -> SimConfig:
    """Read and validate a simulation YAML; errors name the file and the key."""
    return load_yaml(path, SimConfig)
