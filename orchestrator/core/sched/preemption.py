"""Which running request yields: the victim rules of recompute preemption, as pure
functions over the running list (best first by the ordering policy's ``running_key``,
so the last one is the first victim). ``cap`` is ``max_preemptions``: a request
preempted that often is passed over while any other candidate is left."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.core.request import Request


def kv_victim(running: Sequence[Request], request: Request, cap: int) -> Request:
    """The running request to preempt so that ``request`` (running) gets its next block.

    The worst request below it that is under the cap, then itself, then any request
    under the cap; if every request is at the cap, progress wins over the cap and the
    worst other request yields."""
    position = running.index(request)
    for victim in reversed(running[position + 1 :]):
        if victim.num_preemptions < cap:
            return victim
    if request.num_preemptions < cap:
        return request
    for victim in reversed(running):
        if victim.num_preemptions < cap and victim is not request:
            return victim
    others = [r for r in running if r is not request]
    return others[-1] if others else request


def priority_victim(running: Sequence[Request], candidate: Request, cap: int) -> Request | None:
    """The worst running request under the cap whose priority is worse (higher) than the
    waiting ``candidate``'s, or ``None``."""
    for r in reversed(running):
        if r.priority > candidate.priority and r.num_preemptions < cap:
            return r
    return None
