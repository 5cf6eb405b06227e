"""Tenant fair share: a waiting queue ordered by service received, not by a static key.

The Virtual Token Counter (VTC; Sheng et al., "Fairness in Serving Large Language
Models", OSDI 2024) keeps one counter per tenant of the weighted service it has had and
serves the backlogged tenant with the smallest counter. A counter grows while its
tenant's requests wait for others, so it cannot be a heap key fixed at push time; this
queue keeps one heap per (SLO class, tenant), each ordered by the ordering policy's
static key, and chooses among the heads when asked:

- within a class, the head of the tenant with the smallest counter (ties: the policy's
  key), so fairness is between tenants of the same class;
- across classes, the policy's order of those candidates (deadline, priority, arrival).

The choice is cached until the queue or a counter changes, so the admission loop's
``peek``/``pop`` stay O(classes x tenants) per change, not per call; the hot path of a
scheduler without fair share never sees this class (it keeps ``WaitingQueue``).

Service accounting (``charge``): the scheduler charges ``input_weight`` per prompt token
when a request is first admitted and ``output_weight`` per output token as each is
produced, divided by the tenant's weight. A tenant that becomes backlogged after being
idle has its counter lifted to the smallest counter among backlogged tenants, so idle
time is not banked as credit (VTC's counter lift).

Bound (VTC, Theorem 4.4, for this accounting): over any interval in which two tenants
``a`` and ``b`` of one class stay backlogged, their weighted services differ by at most
``2 * max(input_weight * L, output_weight * M)``, where ``L`` is the longest prompt
(tokens, at most ``max_model_len``) and ``M`` the most tokens the running batch holds
(the KV pool's tokens): a tenant is picked only while it has the smallest counter, and
what one admission can add before the other tenant is picked again is one prompt's
charge plus the output of what already runs. ``tests/unit/test_fair_share.py`` checks
the bound step by step.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from orchestrator.core.request import Request
from orchestrator.core.sched.ordering import OrderingPolicy, SortKey

_Entry = tuple[SortKey, int, Request]


class FairShareQueue:
    """The waiting queue under tenant fair share (same interface as ``WaitingQueue``).

    ``weights`` maps a tenant to its share weight (default 1); ``counters`` are the
    tenants' weighted services so far (tokens / weight). Removal is lazy, as in
    ``WaitingQueue``; ``num_tokens`` counts the members' uncomputed tokens.
    """

    def __init__(self, policy: OrderingPolicy, weights: dict[str, float]) -> None:
        self.policy = policy
        self.weights = weights
        self.counters: dict[str, float] = {}
        self._groups: dict[str | None, dict[str, list[_Entry]]] = {}
        self._seq = itertools.count()
        self._members: dict[str, int] = {}
        self._backlog: dict[str, int] = {}  # tenant -> live waiting requests
        self._best: Request | None = None
        self._stale = True
        self.num_tokens = 0

    @staticmethod
    def tenant_of(r: Request) -> str:
        return r.tenant if r.tenant is not None else ""

    def push(self, r: Request) -> None:
        if r.request_id in self._members:
            raise ValueError(f"request {r.request_id!r} is already waiting")
        tenant = self.tenant_of(r)
        if not self._backlog.get(tenant):
            busy = [self.counters.get(t, 0.0) for t, n in self._backlog.items() if n]
            if busy:
                self.counters[tenant] = max(self.counters.get(tenant, 0.0), min(busy))
        seq = next(self._seq)
        heap = self._groups.setdefault(r.slo_class, {}).setdefault(tenant, [])
        heapq.heappush(heap, (self.policy.admission_key(r), seq, r))
        self._members[r.request_id] = seq
        self._backlog[tenant] = self._backlog.get(tenant, 0) + 1
        self.num_tokens += r.num_tokens
        self._stale = True

    def _head(self, heap: list[_Entry]) -> _Entry | None:
        members = self._members
        while heap and members.get(heap[0][2].request_id) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def peek(self) -> Request | None:
        if not self._stale:
            return self._best
        counters = self.counters
        best: _Entry | None = None
        for cls, tenants in list(self._groups.items()):
            pick: tuple[float, _Entry] | None = None
            for tenant, heap in list(tenants.items()):
                head = self._head(heap)
                if head is None:
                    del tenants[tenant]
                    continue
                rank = (counters.get(tenant, 0.0), head)
                if pick is None or rank[0] < pick[0] or (rank[0] == pick[0] and head < pick[1]):
                    pick = rank
            if not tenants:
                del self._groups[cls]
            if pick is not None and (best is None or pick[1][:2] < best[:2]):
                best = pick[1]
        self._best = best[2] if best is not None else None
        self._stale = False
        return self._best

    def pop(self) -> Request:
        r = self.peek()
        if r is None:
            raise IndexError("pop from an empty waiting queue")
        heapq.heappop(self._groups[r.slo_class][self.tenant_of(r)])
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
        self._backlog[self.tenant_of(r)] -= 1
        self.num_tokens -= r.num_tokens
        self._stale = True

    def charge(self, request: Request, tokens: float) -> None:
        """Add ``tokens`` (already weighted by token kind) of service to the request's
        tenant, divided by the tenant's weight."""
        tenant = self.tenant_of(request)
        weight = self.weights.get(tenant, 1.0)
        self.counters[tenant] = self.counters.get(tenant, 0.0) + tokens / weight
        self._stale = True

    def ahead_of(self, key: SortKey) -> Iterator[Request]:
        """The waiting requests whose policy key is smaller than ``key`` (an estimate of
        what runs first: fair share may reorder tenants)."""
        members = self._members
        for tenants in self._groups.values():
            for heap in tenants.values():
                for k, seq, r in heap:
                    if k < key and members.get(r.request_id) == seq:
                        yield r

    def __len__(self) -> int:
        return len(self._members)
