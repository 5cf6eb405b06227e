"""Ordering policies alone: their keys, the waiting queue over them, and the aging bound."""

from __future__ import annotations

import pytest

from orchestrator.core.config import SchedulerConfig
from orchestrator.core.sched.ordering import (
    ORDERING_POLICIES,
    FcfsOrdering,
    PriorityOrdering,
    make_ordering,
)
from orchestrator.core.sched.waiting import WaitingQueue
from tests.factories import make_request


def drain(queue: WaitingQueue) -> list[str]:
    return [queue.pop().request_id for _ in range(len(queue))]


def test_fcfs_admits_by_arrival_whatever_the_priority() -> None:
    queue = WaitingQueue(FcfsOrdering())
    for rid, prio, t in (("late", 0, 2.0), ("early", 9, 0.5), ("mid", 5, 1.0)):
        queue.push(make_request(request_id=rid, priority=prio, arrival_time=t))
    assert drain(queue) == ["early", "mid", "late"]


def test_priority_admits_lower_priority_first_then_arrival() -> None:
    queue = WaitingQueue(PriorityOrdering(aging_rate=0.0))
    for rid, prio, t in (("b", 1, 0.0), ("a2", 0, 1.0), ("a1", 0, 0.5)):
        queue.push(make_request(request_id=rid, priority=prio, arrival_time=t))
    assert drain(queue) == ["a1", "a2", "b"]


@pytest.mark.parametrize("aging_rate", [0.5, 2.0, 100.0])
def test_aging_bound_holds_exactly_at_its_stated_time(aging_rate: float) -> None:
    # Priority p arriving at t0 is ahead of priority q < p arriving after
    # t0 + (p - q) / aging_rate, and behind one arriving before.
    p, q, t0 = 10, 0, 3.0
    bound = t0 + (p - q) / aging_rate
    policy = PriorityOrdering(aging_rate)
    old = make_request(priority=p, arrival_time=t0)
    after = make_request(priority=q, arrival_time=bound + 1e-6)
    before = make_request(priority=q, arrival_time=bound - 1e-6)
    assert policy.admission_key(old) < policy.admission_key(after)
    assert policy.admission_key(before) < policy.admission_key(old)


def test_running_order_puts_the_preemption_victim_last() -> None:
    policy = PriorityOrdering(aging_rate=1.0)
    reqs = [
        make_request(request_id="hi-old", priority=0, arrival_time=0.0),
        make_request(request_id="lo-new", priority=3, arrival_time=2.0),
        make_request(request_id="lo-old", priority=3, arrival_time=1.0),
    ]
    ordered = sorted(reqs, key=policy.running_key)
    assert [r.request_id for r in ordered] == ["hi-old", "lo-old", "lo-new"]
    fcfs = sorted(reqs, key=FcfsOrdering().running_key)
    assert fcfs[-1].request_id == "lo-new"


def test_removed_requests_are_skipped_and_stop_counting() -> None:
    queue = WaitingQueue(FcfsOrdering())
    a, b = make_request(request_id="a", prompt_len=5), make_request(request_id="b", prompt_len=7)
    queue.push(a)
    queue.push(b)
    assert queue.remove(a) and not queue.remove(a)
    assert len(queue) == 1 and queue.num_tokens == 7
    assert queue.peek() is b


def test_config_names_pick_registered_policies_and_unknown_ones_are_refused() -> None:
    assert isinstance(make_ordering(SchedulerConfig(policy="fcfs")), FcfsOrdering)
    priority = make_ordering(SchedulerConfig(policy="priority", aging_rate=3.0))
    assert isinstance(priority, PriorityOrdering) and priority.aging_rate == 3.0
    with pytest.raises(ValueError, match=r"policy\n  Input should be 'fcfs', 'priority' or 'slo'"):
        SchedulerConfig(policy="sjf")
    assert set(ORDERING_POLICIES) == {"fcfs", "priority", "slo"}
