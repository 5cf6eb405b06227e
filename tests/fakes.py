"""Test doubles shared across suites."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.core.executor import ExecutorInfo
from orchestrator.core.output import SchedulerOutput, StepResult


def fake_token(request_id: str, position: int, vocab_size: int = 1000) -> int:
    """The token a ``FakeExecutor`` samples for a request whose last known token sits at
    ``position``: a pure function of the request id and position, so a request's
    output does not depend on batching, chunking or preemption."""
    digest = hashlib.blake2b(f"{request_id}:{position}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % vocab_size


class FakeExecutor:
    """Deterministic executor: token = f(request id, position); a fixed step time.

    It checks the plan against what an executor may rely on (block tables cover the
    positions run, block ids are within capacity) and records every plan it saw.
    """

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")

        num_blocks: int = 64
        step_time_s: float = 0.01

    def __init__(self, num_blocks: int = 64, block_size: int = 16, step_time_s: float = 0.01):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.step_time_s = step_time_s
        self.plans: list[SchedulerOutput] = []
        self.shut_down = False

    @classmethod
    def from_config(cls, config: Any, engine: Any) -> FakeExecutor:
        return cls(config.num_blocks, engine.cache.block_size, config.step_time_s)

    def info(self) -> ExecutorInfo:
        return ExecutorInfo(
            self.num_blocks, self.block_size, max_model_len=None, platform=(("device", "fake"),)
        )

    def crash_after(self, steps: int) -> None:
        """From now on, ``execute`` raises ``RuntimeError("device lost")`` once ``steps``
        plans have run: a broken executor, which stops the engine."""
        execute = self.execute

        def crashing(plan: SchedulerOutput) -> StepResult:
            if len(self.plans) >= steps:
                raise RuntimeError("device lost")
            return execute(plan)

        self.execute = crashing  # type: ignore[method-assign]

    def hold_after(self, steps: int, release: threading.Event, timeout_s: float = 10.0) -> None:
        """From now on, once ``steps`` plans have run, each ``execute`` first waits for
        ``release`` (at most ``timeout_s``): a step held in flight, so a test can act
        between two steps however fast the engine thread runs."""
        execute = self.execute

        def held(plan: SchedulerOutput) -> StepResult:
            if len(self.plans) >= steps and not release.wait(timeout_s):
                raise AssertionError(f"the held step was not released within {timeout_s} s")
            return execute(plan)

        self.execute = held  # type: ignore[method-assign]

    def execute(self, plan: SchedulerOutput) -> StepResult:
        self.plans.append(plan)
        sampled: dict[str, int] = {}
        for s in plan.scheduled:
            needed_blocks = -(-s.context_len // self.block_size)
            assert len(s.block_table) >= needed_blocks, (s.request_id, s.block_table)
            assert all(0 <= b < self.num_blocks for b in s.block_table)
            if s.sample:
                sampled[s.request_id] = fake_token(s.request_id, s.context_len - 1)
        return StepResult(sampled=sampled, duration_s=self.step_time_s)

    def shutdown(self) -> None:
        self.shut_down = True
