"""The waiting queue: one lazy heap of requests, best first by an ordering policy."""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.core.request import Request
from orchestrator.core.sched.ordering import OrderingPolicy, SortKey
from orchestrator.core.sched.queue import LazyHeap


class WaitingQueue:
    """A ``RequestQueue`` keyed by ``policy.admission_key``: one ``LazyHeap``."""

    def __init__(self, policy: OrderingPolicy) -> None:
        self.policy = policy
        self._heap = LazyHeap()
        self.num_tokens = 0

    def push(self, r: Request) -> None:
        self._heap.push(self.policy.admission_key(r), r)
        self.num_tokens += r.num_tokens

    def peek(self) -> Request | None:
        head = self._heap.head()
        return head[2] if head is not None else None

    def pop(self) -> Request:
        if self._heap.head() is None:
            raise IndexError("pop from an empty waiting queue")
        r = self._heap.pop_head()
        self.num_tokens -= r.num_tokens
        return r

    def remove(self, r: Request) -> bool:
        """Drop a waiting request (abort); ``False`` if it was not waiting."""
        if not self._heap.discard(r):
            return False
        self.num_tokens -= r.num_tokens
        return True

    def ahead_of(self, key: SortKey) -> Iterator[Request]:
        return self._heap.ahead_of(key)

    def __len__(self) -> int:
        return len(self._heap)
