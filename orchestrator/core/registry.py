"""Executor classes by type name, from the entry-point group ``orchestrator.executors``
(see pyproject.toml), so ``executor: {type: torch, ...}`` selects a class without an
if-chain and an out-of-tree package can add its own.

This module imports nothing of the core, so the config may look an executor's options
model up here without importing the executor seam (which names the config's types).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

ENTRY_POINT_GROUP = "orchestrator.executors"


class UnknownExecutorError(ValueError):
    """No executor is registered under the type name a config gives."""


def registered_executors() -> dict[str, Any]:
    """Entry points by executor type name (not yet loaded)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def registered_class(type_name: str) -> Any:
    """Load the class registered as ``type_name``; ``UnknownExecutorError`` names the
    registered ones when there is none. Typed ``Any`` here: ``executor.executor_class``
    gives it its protocol."""
    eps = registered_executors()
    if type_name not in eps:
        known = ", ".join(sorted(eps)) or "none (is the project installed?)"
        raise UnknownExecutorError(f"unknown executor type {type_name!r}; registered: {known}")
    return eps[type_name].load()
