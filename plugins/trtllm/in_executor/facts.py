"""Per-request facts that travel from the submitting side to the worker's scheduler,
keyed by TensorRT-LLM's request id (``LlmRequest.py_request_id``, the id
``generate_async``'s result carries).

TensorRT-LLM's ``generate_async(priority=)`` (where a release has it) carries one float
in [0, 1]; our scheduler also orders and budgets by SLO class (its TTFT deadline and
TPOT target) and charges tenants, so those travel here. On one tensor-parallel rank
TensorRT-LLM's worker runs in the serving process (``install``), so a lock-guarded map
(``FactsChannel``) is the whole transport; on more, rank 0 runs in a worker process and
``channel.WorkerLink`` brings the facts over a socket. The adapter reads either through
``FactsSource``.

A submitter registers under ``submitting()``: the executor thread may pick a request up
between ``generate_async`` returning its id and the facts being stored, so the adapter's
``take`` waits on the same lock and never sees a request before its facts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What the core needs of a request beyond its tokens: ``priority`` (ours, lower
    first), ``slo_class`` (a configured class name; ``None`` for the default),
    ``tenant`` (``None`` when fair share is unused) and ``arrival_time`` (seconds on the
    worker scheduler's clock, the TTFT deadline counts from it; ``None``: when the
    adapter first sees the request)."""

    priority: int = 0
    slo_class: str | None = None
    tenant: str | None = None
    arrival_time: float | None = None


class FactsSource(Protocol):
    """What the adapter reads facts from. ``take(request_id)``: the facts registered for
    the request, removed, or ``None``. ``facts_wait_s``: how long (seconds) the adapter
    holds a request whose facts are not there yet before admitting it with the defaults:
    0 where facts always come first (``FactsChannel.submitting``), more where they
    travel separately from the request (``channel.WorkerLink``)."""

    @property
    def facts_wait_s(self) -> float: ...

    def take(self, request_id: int) -> RequestFacts | None: ...

    def wait_for_facts(self, timeout_s: float) -> bool:
        """Block until facts arrive (a submission: the submitting side registers facts
        for every request it sends) or ``timeout_s`` seconds pass; whether facts came.
        The adapter's idle wait, so a new submission ends it at once."""
        ...


class FactsSubmitter(Protocol):
    """What the submitting side writes facts into: ``submitting()`` yields a map to put
    ``{request_id: facts}`` into once ``generate_async`` returned the id
    (``FactsChannel`` in one process, ``channel.ChannelHost`` across processes)."""

    def submitting(self) -> AbstractContextManager[dict[int, RequestFacts]]: ...


class FactsChannel:
    """Thread-safe map from TensorRT-LLM request id to ``RequestFacts``, in one process.
    ``facts_wait_s`` is 0: ``submitting()`` stores the facts before the adapter can see
    the request, so a request without facts has none to wait for."""

    facts_wait_s = 0.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts: dict[int, RequestFacts] = {}
        self._arrived = threading.Event()

    @contextmanager
    def submitting(self) -> Iterator[dict[int, RequestFacts]]:
        """Hold the channel while submitting: put ``{request_id: facts}`` into the
        yielded map once ``generate_async`` has returned the id; the adapter reads
        nothing until the block ends."""
        with self._lock:
            staged: dict[int, RequestFacts] = {}
            try:
                yield staged
            finally:
                self._facts.update(staged)
                if staged:
                    self._arrived.set()

    def take(self, request_id: int) -> RequestFacts | None:
        """The facts registered for ``request_id``, removed from the channel (the
        adapter keeps what it needs); ``None`` for a request submitted without any
        (then the release's own ``priority`` and the defaults apply)."""
        with self._lock:
            return self._facts.pop(request_id, None)

    def wait_for_facts(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` seconds for the next ``submitting()`` block that
        registered facts; whether one came (see ``FactsSource``)."""
        arrived = self._arrived.wait(timeout_s)
        self._arrived.clear()
        return arrived

    def forget(self, request_id: int) -> None:
        """Drop facts of a request that ended before the scheduler saw it."""
        with self._lock:
            self._facts.pop(request_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._facts)
