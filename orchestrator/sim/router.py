"""Routers: which replica an arriving request goes to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Load(Protocol):
    """What a router may know about a replica."""

    @property
    def outstanding_tokens(self) -> int:
        """Prompt tokens not yet prefilled plus output tokens not yet produced, over the
        requests routed to it and not finished."""
        ...


class Router(Protocol):
    def choose(self, replicas: Sequence[Load]) -> int:
        """Index of the replica for the next request."""
        ...


class RoundRobinRouter:
    """Each replica in turn, whatever its load."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[Load]) -> int:
        index = self._next % len(replicas)
        self._next = index + 1
        return index


class LeastOutstandingTokensRouter:
    """The replica with the least work left, in tokens; ties go to the lowest index, so
    the choice is deterministic."""

    def choose(self, replicas: Sequence[Load]) -> int:
        return min(range(len(replicas)), key=lambda i: replicas[i].outstanding_tokens)


ROUTERS: dict[str, type[Router]] = {
    "round_robin": RoundRobinRouter,
    "least_outstanding_tokens": LeastOutstandingTokensRouter,
}


def make_router(name: str) -> Router:
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}") from None
