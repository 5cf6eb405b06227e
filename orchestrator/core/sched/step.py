"""The state of one scheduling step, created by ``Scheduler.schedule`` and dropped when
the plan is built, so nothing about a step outlives it on the scheduler."""

from __future__ import annotations

from orchestrator.core.output import ScheduledRequest


class StepState:
    """What one step has decided so far.

    ``budget`` is the tokens still free this step; ``scheduled`` the plan entries by
    request id; ``preempted`` the requests preempted in this step (not readmitted in it);
    ``kv_preempted`` whether a running request had to yield for KV blocks (then nothing
    new is admitted: it would only grow the pressure that caused it).
    """

    __slots__ = ("budget", "kv_preempted", "preempted", "scheduled")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.scheduled: dict[str, ScheduledRequest] = {}
        self.preempted: set[str] = set()
        self.kv_preempted = False
