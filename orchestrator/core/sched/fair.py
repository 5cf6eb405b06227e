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
scheduler without fair share never sees this class (it keeps ``WaitingQueue``). Each
(class, tenant) heap is a ``queue.LazyHeap``, as ``WaitingQueue``'s one heap is.

Service accounting (``FairShare``, called by the scheduler through its hooks) charges
``input_weight`` per prompt token when a request is first admitted and ``output_weight``
per output token as each is produced; the queue divides a charge by the tenant's weight
(``charge``). A tenant that becomes backlogged after being
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

import itertools
from collections.abc import Iterator

from orchestrator.core.config import FairShareConfig
from orchestrator.core.output import RequestOutput
from orchestrator.core.request import Request
from orchestrator.core.sched.ordering import OrderingPolicy, SortKey
from orchestrator.core.sched.queue import Entry, LazyHeap


class FairShareQueue:
    """The ``RequestQueue`` under tenant fair share.

    ``weights`` maps a tenant to its share weight (default 1); ``counters`` are the
    tenants' weighted services so far (tokens / weight). ``num_tokens`` counts the
    members' uncomputed tokens.
    """

    def __init__(self, policy: OrderingPolicy, weights: dict[str, float]) -> None:
        self.policy = policy
        self.weights = weights
        self.counters: dict[str, float] = {}
        self._groups: dict[str | None, dict[str, LazyHeap]] = {}
        # One sequence for every heap: heads of different heaps are compared.
        self._seq = itertools.count()
        self._size = 0
        self._backlog: dict[str, int] = {}  # tenant -> live waiting requests
        self._best: Request | None = None
        self._stale = True
        self.num_tokens = 0

    @staticmethod
    def tenant_of(r: Request) -> str:
        return r.tenant if r.tenant is not None else ""

    def _heap_of(self, r: Request) -> LazyHeap | None:
        tenants = self._groups.get(r.slo_class)
        return tenants.get(self.tenant_of(r)) if tenants is not None else None

    def push(self, r: Request) -> None:
        tenant = self.tenant_of(r)
        tenants = self._groups.setdefault(r.slo_class, {})
        heap = tenants.get(tenant)
        if heap is None:
            heap = tenants[tenant] = LazyHeap(self._seq)
        heap.push(self.policy.admission_key(r), r)  # raises for a request already queued
        if not self._backlog.get(tenant):
            busy = [self.counters.get(t, 0.0) for t, n in self._backlog.items() if n]
            if busy:
                self.counters[tenant] = max(self.counters.get(tenant, 0.0), min(busy))
        self._backlog[tenant] = self._backlog.get(tenant, 0) + 1
        self._size += 1
        self.num_tokens += r.num_tokens
        self._stale = True

    def peek(self) -> Request | None:
        if not self._stale:
            return self._best
        counters = self.counters
        best: Entry | None = None
        for cls, tenants in list(self._groups.items()):
            pick: tuple[float, Entry] | None = None
            for tenant, heap in list(tenants.items()):
                head = heap.head()
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
        heap = self._heap_of(r)
        assert heap is not None  # peek found it at the head of its heap
        heap.pop_head()
        self._forget(r)
        return r

    def remove(self, r: Request) -> bool:
        """Drop a waiting request (abort); ``False`` if it was not waiting."""
        heap = self._heap_of(r)
        if heap is None or not heap.discard(r):
            return False
        self._forget(r)
        return True

    def _forget(self, r: Request) -> None:
        self._backlog[self.tenant_of(r)] -= 1
        self._size -= 1
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
        for tenants in self._groups.values():
            for heap in tenants.values():
                yield from heap.ahead_of(key)

    def __len__(self) -> int:
        return self._size


class FairShare:
    """Fair-share accounting: the scheduler's hooks that charge tenants for service.

    ``queue`` is the waiting queue the scheduler uses while fair share is on. A request
    is charged ``input_weight`` per prompt token when it is first admitted
    (``on_first_admit``) and ``output_weight`` per output token (``on_outputs``), from
    submission (``on_submit``) until it finishes or leaves (``forget``).
    """

    def __init__(self, config: FairShareConfig, policy: OrderingPolicy) -> None:
        self.queue = FairShareQueue(policy, dict(config.tenant_weights))
        self._input_weight = config.input_weight
        self._output_weight = config.output_weight
        self._charged: dict[str, Request] = {}  # by id, while output tokens are charged

    def on_submit(self, request: Request) -> None:
        self._charged[request.request_id] = request

    def on_first_admit(self, request: Request) -> None:
        self.queue.charge(request, self._input_weight * request.num_prompt_tokens)

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        """Charge each output token to its tenant; stop charging finished requests."""
        charged, weight = self._charged, self._output_weight
        for out in outputs:
            request = charged.get(out.request_id)
            if request is None:
                continue
            if out.new_token_ids:
                self.queue.charge(request, weight * len(out.new_token_ids))
            if out.finished:
                del charged[out.request_id]

    def forget(self, request_id: str) -> None:
        """A request left without finishing through ``on_outputs`` (abort, shedding)."""
        self._charged.pop(request_id, None)
