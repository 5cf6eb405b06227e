"""The waiting queue's contract (``RequestQueue``) and the lazy heap both queues build on.

Two queues implement the contract: ``waiting.WaitingQueue`` (one heap, keyed by the
ordering policy) and ``fair.FairShareQueue`` (one heap per SLO class and tenant, chosen
among by service received). Both keep their requests in ``LazyHeap``s.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Protocol

from orchestrator.core.request import Request
from orchestrator.core.sched.ordering import SortKey

# (admission key, sequence number, request): the sequence number breaks ties in push
# order and tells a live entry from a stale one.
Entry = tuple[SortKey, int, Request]


class RequestQueue(Protocol):
    """Waiting requests, best first.

    ``push`` raises ``ValueError`` for a request already queued; ``peek`` is the request
    ``pop`` would return (``None`` when empty; ``pop`` then raises ``IndexError``);
    ``remove`` drops a queued request (abort, shedding) and is ``False`` when it was not
    queued. ``num_tokens`` is the members' uncomputed tokens (prompt plus output) and
    ``len`` their count, both updated at once on every change. ``ahead_of(key)`` yields
    the members whose admission key is below ``key``, in no order (O(n): only
    admission-time predictions call it).
    """

    num_tokens: int

    def push(self, request: Request) -> None: ...

    def peek(self) -> Request | None: ...

    def pop(self) -> Request: ...

    def remove(self, request: Request) -> bool: ...

    def ahead_of(self, key: SortKey) -> Iterator[Request]: ...

    def __len__(self) -> int: ...


class LazyHeap:
    """A heap of requests by ``(key, seq)``, with removal in O(1).

    Removal is lazy: a removed request's entry stays in the heap, is skipped when it
    reaches the top and stops counting at once. ``seq`` numbers come from ``counter``,
    which heaps that are compared with each other share (so ties across them break in
    push order too). Keys must not change while a request is queued.
    """

    __slots__ = ("_counter", "_heap", "_live")

    def __init__(self, counter: Iterator[int] | None = None) -> None:
        self._counter = counter if counter is not None else itertools.count()
        self._heap: list[Entry] = []
        # request id -> sequence number of its live entry; other entries are stale.
        self._live: dict[str, int] = {}

    def push(self, key: SortKey, request: Request) -> None:
        """Queue ``request`` under ``key``; ``ValueError`` if it is queued already."""
        rid = request.request_id
        if rid in self._live:
            raise ValueError(f"request {rid!r} is already waiting")
        seq = next(self._counter)
        heapq.heappush(self._heap, (key, seq, request))
        self._live[rid] = seq

    def head(self) -> Entry | None:
        """The smallest live entry (stale ones above it are dropped), or ``None``."""
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][2].request_id) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def pop_head(self) -> Request:
        """Remove and return the request of ``head()``; call only after ``head()``
        returned an entry, with no change in between."""
        request = heapq.heappop(self._heap)[2]
        del self._live[request.request_id]
        return request

    def discard(self, request: Request) -> bool:
        """Drop ``request``; ``False`` if it was not queued."""
        return self._live.pop(request.request_id, None) is not None

    def __contains__(self, request: Request) -> bool:
        return request.request_id in self._live

    def ahead_of(self, key: SortKey) -> Iterator[Request]:
        """Live members whose key is below ``key``, in heap order (O(n))."""
        live = self._live
        for k, seq, r in self._heap:
            if k < key and live.get(r.request_id) == seq:
                yield r

    def __len__(self) -> int:
        return len(self._live)
