"""The executor seam: what runs a ``SchedulerOutput`` and how YAML picks one.

Executors are found by name through the entry-point group ``orchestrator.executors``
(``registry.py``), so ``executor: {type: torch, ...}`` in a config selects a class
without an if-chain, and an out-of-tree package can add its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

from orchestrator.core.config import EngineConfig
from orchestrator.core.constraint import ConstraintKind
from orchestrator.core.output import SchedulerOutput, StepResult
from orchestrator.core.registry import (
    ENTRY_POINT_GROUP,
    UnknownExecutorError,
    registered_class,
    registered_executors,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Executor",
    "ExecutorFactory",
    "ExecutorInfo",
    "UnknownExecutorError",
    "create_executor",
    "executor_class",
    "registered_executors",
]


@dataclass(frozen=True, slots=True)
class ExecutorInfo:
    """What an executor tells the engine about itself, read once when the engine is built.

    ``num_kv_blocks`` blocks of ``block_size`` tokens are what it holds for the lifetime
    of the executor; block ids in plans are in ``[0, num_kv_blocks)``. ``max_model_len``
    is the longest sequence (prompt plus output, tokens) it can run, ``None`` when it has
    no limit of its own (the config must then set one). ``eos_token_ids`` are the
    model's end-of-sequence ids (empty when the executor has no tokenizer facts).
    Capability flags: ``reports_step_cost``: every ``StepResult`` carries a ``cost``
    breakdown; ``owns_batching``: the backend batches in flight itself and our scheduler
    only admits, orders and preempts; ``top_logprobs``: it can return the top-N
    alternatives, not only the chosen token's logprob; ``seeded_survives_preemption``:
    a seeded request's random sequence continues unchanged after recompute preemption;
    ``mirrors_executor_kv``: the executor allocates KV by its own manager's rule (a
    request's known tokens whole on its first chunk) and that manager's free count is the
    truth, so the engine's KV manager mirrors it (``KVCacheManager(mirror_executor=True)``,
    whose allocation rule is then ``MirrorExecutor``).
    ``constraint_kinds``: the constraint kinds it enforces (empty: none; a constrained
    submission is then refused); an executor with any implements ``ConstraintBackend``.
    ``num_gpus`` is how many accelerators one replica of it occupies (1 for a CPU).
    ``platform`` names what it runs on and in, as ``(key, value)`` pairs (e.g. device,
    dtype, kernel variant), for the start-up log and ``/metrics``; free-form, never
    interpreted outside the executor.
    """

    num_kv_blocks: int
    block_size: int
    max_model_len: int | None
    eos_token_ids: tuple[int, ...] = ()
    reports_step_cost: bool = False
    owns_batching: bool = False
    top_logprobs: bool = True
    seeded_survives_preemption: bool = True
    mirrors_executor_kv: bool = False
    constraint_kinds: frozenset[ConstraintKind] = frozenset()
    num_gpus: int = 1
    platform: tuple[tuple[str, str], ...] = ()


@runtime_checkable
class Executor(Protocol):
    """Runs one scheduled step at a time.

    Invariants the contract suite (tests/contract) checks for every executor:
    - ``info()`` is constant for the executor's lifetime.
    - ``execute(plan)`` returns exactly one sampled token for each scheduled request with
      ``sample=True`` and none for others, or names the request in ``failed`` when it
      cannot run it (only that request ends; raising from ``execute`` means the executor
      itself is broken and stops the engine); it never mutates ``plan``.
    - A request's tokens depend only on its own tokens and sampling params (and seed),
      never on what else shares the batch.
    - A constrained request (``ScheduledRequest.constraint`` set) only ever samples
      tokens its constraint allows; once the constraint is complete only an
      end-of-sequence id; a sampled token the constraint refuses fails that request only.
    - ``shutdown()`` releases resources; it is safe to call twice.
    """

    def info(self) -> ExecutorInfo: ...

    def execute(self, plan: SchedulerOutput) -> StepResult: ...

    def shutdown(self) -> None: ...


class ExecutorFactory(Protocol):
    """What an entry point names: a class with a pydantic ``Config`` and ``from_config``.

    ``Config`` must import without the backend's heavy dependencies so that config files
    validate on any machine; ``from_config`` may import them. A factory may also define
    ``describe(config, engine) -> tuple[tuple[str, str], ...]``: what ``from_config``
    would run on and in, without loading anything heavy (``orchestrator doctor`` prints it).
    """

    Config: ClassVar[type[BaseModel]]

    @classmethod
    def from_config(cls, config: Any, engine: EngineConfig) -> Executor: ...


def executor_class(type_name: str) -> ExecutorFactory:
    """Load the factory class registered as ``type_name`` (``UnknownExecutorError`` when
    there is none)."""
    factory: ExecutorFactory = registered_class(type_name)
    return factory


def create_executor(engine: EngineConfig) -> Executor:
    """Build the executor an engine config names."""
    factory = executor_class(engine.executor.type)
    return factory.from_config(engine.executor.options, engine)
