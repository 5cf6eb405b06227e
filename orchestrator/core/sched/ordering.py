"""Ordering policies: the order in which waiting requests are admitted, and which running
request yields first. Chosen by ``scheduler.policy`` in config (a key of
``ORDERING_POLICIES``, which a unit test checks against the config's ``PolicyName``);
a new policy is a new class here, not a branch in the scheduler.

A policy is a pair of sort keys (tenant fair share, which is not a static key, is a
waiting queue of its own: ``fair.py``). Keys are compared as tuples, smaller first, and must not
change while a request waits (a heap holds them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from orchestrator.core.config import SchedulerConfig
from orchestrator.core.request import Request

SortKey = tuple[float, float]


class OrderingPolicy(Protocol):
    """How requests compare.

    ``admission_key``: waiting requests are admitted smallest key first.
    ``ranks_by_priority``: whether a better (lower) ``priority`` ranks a later arrival
    ahead of earlier ones (what the TTFT forecast must expect of later arrivals).
    ``running_key``: running requests are kept sorted by it; the last one is the first
    preemption victim. ``preempt_for_priority``: whether, by default, a waiting request
    that ranks strictly better may evict a running one (the config's
    ``scheduler.preempt_for_priority`` overrides it).
    """

    preempt_for_priority: bool
    ranks_by_priority: bool

    def admission_key(self, request: Request) -> SortKey: ...

    def running_key(self, request: Request) -> SortKey: ...


class FcfsOrdering:
    """First come, first served: by arrival time; the latest arrival yields first."""

    preempt_for_priority = False
    ranks_by_priority = False

    def admission_key(self, request: Request) -> SortKey:
        return (request.arrival_time, 0.0)

    def running_key(self, request: Request) -> SortKey:
        return (request.arrival_time, 0.0)


class PriorityOrdering:
    """Lower ``priority`` first, with aging.

    The admission key is ``priority + aging_rate * arrival_time``: a request's effective
    priority improves by ``aging_rate`` levels per second waited, and because every
    waiting request ages at the same rate the order never changes while they wait, so a
    heap keeps it. Starvation bound: a request of priority ``p`` that arrived at ``t0`` is
    ahead of any request of priority ``q < p`` arriving after ``t0 + (p - q) /
    aging_rate``. Among running requests the worst priority, then the latest arrival,
    yields first.
    """

    preempt_for_priority = True
    ranks_by_priority = True

    def __init__(self, aging_rate: float) -> None:
        self.aging_rate = aging_rate

    def admission_key(self, request: Request) -> SortKey:
        return (request.priority + self.aging_rate * request.arrival_time, request.arrival_time)

    def running_key(self, request: Request) -> SortKey:
        return (request.priority, request.arrival_time)


class SloOrdering:
    """Earliest TTFT deadline first, within priority strata, with aging.

    A request's deadline ``d`` is its arrival plus its SLO class's TTFT target (its
    arrival when it has no class), fixed at submission. The admission key is ``(priority
    + aging_rate * d, d)``: among equal priorities it is earliest deadline first, and a
    better priority is worth ``1 / aging_rate`` seconds of deadline per level, so the
    key never changes while requests wait and a heap keeps it. Starvation bound: a
    request of priority ``p`` with deadline ``d0`` is ahead of any request of priority
    ``q <= p`` whose deadline is after ``d0 + (p - q) / aging_rate``; since a deadline is
    at least its request's arrival, a request is overtaken by at most the requests that
    arrive before ``d0 + (p - q) / aging_rate`` (with ``aging_rate`` 0, strata are
    strict and a worse stratum waits while a better one has work). Among running
    requests the worst priority, then the latest deadline, yields first.
    """

    preempt_for_priority = True
    ranks_by_priority = True

    def __init__(self, aging_rate: float) -> None:
        self.aging_rate = aging_rate

    def admission_key(self, request: Request) -> SortKey:
        deadline = request.ttft_deadline
        return (request.priority + self.aging_rate * deadline, deadline)

    def running_key(self, request: Request) -> SortKey:
        return (request.priority, request.ttft_deadline)


ORDERING_POLICIES: dict[str, Callable[[SchedulerConfig], OrderingPolicy]] = {
    "fcfs": lambda config: FcfsOrdering(),
    "priority": lambda config: PriorityOrdering(config.aging_rate),
    "slo": lambda config: SloOrdering(config.aging_rate),
}


def make_ordering(config: SchedulerConfig) -> OrderingPolicy:
    """The policy ``config.policy`` names (the config validated the name)."""
    return ORDERING_POLICIES[config.policy](config)
