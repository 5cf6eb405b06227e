"""Refusals from the worker's scheduler back to the submitting side, keyed by the id the
``FactsChannel`` uses (``RequestOutput.request_id``, which the worker sees as
``LlmRequest.py_client_id``).

The front admitted a request under the same limits, but the core inside the loop may
still refuse it (its own queue limits, SLO admission on its own predictions, a context
limit or KV pool the front did not check the same way). TensorRT-LLM would keep such a
request in ``active_requests`` forever, unscheduled, and its client would wait forever;
so the adapter says so here and the submitting side (``llm_api.backend``) ends it: the
reason reaches the front's ``StepResult.failed`` (so the core answers the client with
it) and the request is aborted in TensorRT-LLM. ``RefusalChannel`` is the in-process
hand-over, which the backend listens to; on more than one tensor-parallel rank rank 0's
``channel.WorkerLink`` sends refusals to the serving process, whose ``ChannelHost``
hands them to a ``RefusalChannel``. The adapter refuses through ``RefusalSink``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

logger = logging.getLogger(__name__)

RefusalListener = Callable[[int, str], None]
"""Hears ``(request_id, reason)`` on the worker's executor thread; must not block."""


class RefusalSink(Protocol):
    """Where the adapter names a refused request: ``refuse(request_id, reason)`` returns
    whether someone took it and never raises."""

    def refuse(self, request_id: int, reason: str) -> bool: ...


class RefusalChannel:
    """Thread-safe hand-over of refusals to one listener (the submitting backend)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listener: RefusalListener | None = None

    def listen(self, listener: RefusalListener | None) -> None:
        """Hand every later refusal to ``listener`` (``None``: to nobody)."""
        with self._lock:
            self._listener = listener

    def refuse(self, request_id: int, reason: str) -> bool:
        """Tell the listener that ``request_id`` was refused, and why. Returns whether a
        listener took it; never raises (the caller is TensorRT-LLM's executor loop,
        which one request must not stop)."""
        with self._lock:
            listener = self._listener
        if listener is None:
            return False
        try:
            listener(request_id, reason)
        except Exception:  # a closed front must not stop the loop; the request stays refused
            logger.exception("the refusal of request %d could not be delivered", request_id)
            return False
        return True
