"""Waiting-queue policies: the order in which requests are admitted, and which running
request yields first.

A policy is a sort key. ``fcfs`` orders by arrival. ``priority`` orders by
``priority + aging_rate * arrival_time``: a request's effective priority improves by
``aging_rate`` levels per second waited, and because every waiting request ages at the
same rate the order never changes while they wait, so a heap keeps it. A request of
priority ``p`` that arrived at ``t0`` is ahead of any request of priority ``q < p``
arriving after ``t0 + (p - q) / aging_rate``: that is the starvation bound.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Literal

from orchestrator.core.request import Request

SortKey = tuple[float, float, int]


class WaitingQueue:
    """Requests waiting for admission, best first. Removal of an aborted request is lazy:
    it stays in the heap, is skipped when it reaches the top, and stops counting at once.
    """

    def __init__(self, policy: Literal["fcfs", "priority"], aging_rate: float = 0.0) -> None:
        self.policy = policy
        self.aging_rate = aging_rate
        self._heap: list[tuple[SortKey, Request]] = []
        self._seq = itertools.count()
        # request id -> sequence number of its live heap entry; other entries are stale.
        self._members: dict[str, int] = {}
        self.num_tokens = 0  # uncomputed tokens of the members (prompt + output)

    def admission_key(self, r: Request) -> tuple[float, float]:
        if self.policy == "priority":
            return (r.priority + self.aging_rate * r.arrival_time, r.arrival_time)
        return (r.arrival_time, 0.0)

    def running_key(self, r: Request) -> tuple[float, float]:
        """Order among running requests: the last one is the first preemption victim
        (lowest priority, latest arrival)."""
        if self.policy == "priority":
            return (r.priority, r.arrival_time)
        return (r.arrival_time, 0.0)

    def push(self, r: Request) -> None:
        if r.request_id in self._members:
            raise ValueError(f"request {r.request_id!r} is already waiting")
        a, b = self.admission_key(r)
        seq = next(self._seq)
        heapq.heappush(self._heap, ((a, b, seq), r))
        self._members[r.request_id] = seq
        self.num_tokens += r.num_tokens

    def peek(self) -> Request | None:
        heap = self._heap
        while heap and self._members.get(heap[0][1].request_id) != heap[0][0][2]:
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def pop(self) -> Request:
        r = self.peek()
        if r is None:
            raise IndexError("pop from an empty waiting queue")
        heapq.heappop(self._heap)
        self._discard(r)
        return r

    def remove(self, r: Request) -> bool:
        """Drop a waiting request (abort); ``False`` if it was not waiting."""
        if r.request_id not in self._members:
            return False
        self._discard(r)
        return True

    def _discard(self, r: Request) -> None:
        del self._members[r.request_id]
        self.num_tokens -= r.num_tokens

    def __len__(self) -> int:
        return len(self._members)
