"""The waiting queue: requests waiting for admission, best first by an ordering policy."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from orchestrator.core.request import Request
from orchestrator.core.sched.ordering import OrderingPolicy, SortKey


class WaitingQueue:
    """A heap of waiting requests keyed by ``policy.admission_key``.

    Removal of an aborted request is lazy: it stays in the heap, is skipped when it
    reaches the top, and stops counting at once. ``num_tokens`` counts the members'
    uncomputed tokens (prompt plus output).
    """

    def __init__(self, policy: OrderingPolicy) -> None:
        self.policy = policy
        self._heap: list[tuple[SortKey, int, Request]] = []
        self._seq = itertools.count()
        # request id -> sequence number of its live heap entry; other entries are stale.
        self._members: dict[str, int] = {}
        self.num_tokens = 0

    def push(self, r: Request) -> None:
        if r.request_id in self._members:
            raise ValueError(f"request {r.request_id!r} is already waiting")
        key = self.policy.admission_key(r)
        seq = next(self._seq)
        heapq.heappush(self._heap, (key, seq, r))
        self._members[r.request_id] = seq
        self.num_tokens += r.num_tokens

    def peek(self) -> Request | None:
        heap = self._heap
        while heap and self._members.get(heap[0][2].request_id) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

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

    def ahead_of(self, key: SortKey) -> Iterator[Request]:
        """The waiting requests whose admission key is smaller than ``key`` (O(n): only
        admission-time predictions call it)."""
        members = self._members
        for k, seq, r in self._heap:
            if k < key and members.get(r.request_id) == seq:
                yield r

    def __len__(self) -> int:
        return len(self._members)
