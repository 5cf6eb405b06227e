"""The executor seam: what runs a ``SchedulerOutput`` and how YAML picks one.

Executors are found by name through the entry-point group ``orchestrator.executors``
(see pyproject.toml), so ``executor: {type: torch, ...}`` in a config selects a class
without an if-chain, and an out-of-tree package can add its own.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

from orchestrator.core.output import SchedulerOutput, StepResult

if TYPE_CHECKING:
    from orchestrator.core.config import EngineConfig

ENTRY_POINT_GROUP = "orchestrator.executors"


@runtime_checkable
class Executor(Protocol):
    """Runs one scheduled step at a time.

    Invariants the contract suite (tests/contract) checks for every executor:
    - ``kv_capacity()`` is the number of KV blocks of ``block_size`` tokens it holds,
      constant for its lifetime; block ids in block tables are in ``[0, kv_capacity())``.
    - ``execute(plan)`` returns exactly one sampled token for each scheduled request with
      ``sample=True`` and none for others, or names the request in ``failed`` when it
      cannot run it (only that request ends; raising from ``execute`` means the executor
      itself is broken and stops the engine); it never mutates ``plan``.
    - A request's tokens depend only on its own tokens and sampling params (and seed),
      never on what else shares the batch.
    - ``shutdown()`` releases resources; it is safe to call twice.
    """

    def kv_capacity(self) -> int: ...

    def execute(self, plan: SchedulerOutput) -> StepResult: ...

    def shutdown(self) -> None: ...


class ExecutorFactory(Protocol):
    """What an entry point names: a class with a pydantic ``Config`` and ``from_config``.

    ``Config`` must import without the backend's heavy dependencies so that config files
    validate on any machine; ``from_config`` may import them.
    """

    Config: ClassVar[type[BaseModel]]

    @classmethod
    def from_config(cls, config: Any, engine: EngineConfig) -> Executor: ...


class UnknownExecutorError(ValueError):
    pass


def registered_executors() -> dict[str, Any]:
    """Entry points by executor type name (not yet loaded)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def executor_class(type_name: str) -> ExecutorFactory:
    """Load the factory class registered as ``type_name``."""
    eps = registered_executors()
    if type_name not in eps:
        known = ", ".join(sorted(eps)) or "none (is the project installed?)"
        raise UnknownExecutorError(f"unknown executor type {type_name!r}; registered: {known}")
    factory: ExecutorFactory = eps[type_name].load()
    return factory


def create_executor(engine: EngineConfig) -> Executor:
    """Build the executor an engine config names."""
    factory = executor_class(engine.executor.type)
    return factory.from_config(engine.executor.options, engine)
