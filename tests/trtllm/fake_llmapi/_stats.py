"""How TensorRT-LLM's LLM API hands iteration statistics to its caller, reproduced from its
sources (NVIDIA/TensorRT-LLM, the stored commits named), because the adapter's start-up
and free-block refresh depend on exactly these semantics:

- ``AsyncQueue`` and its sync face ``_SyncQueue`` (``tensorrt_llm/llmapi/utils.py`` at
  ``03dd9bb8``): a deque with an ``asyncio.Event``. ``AsyncQueue.get(timeout)`` waits on
  the event (``None``: forever; ``> 0``: raises ``asyncio.TimeoutError`` at the deadline;
  ``<= 0``: raises ``asyncio.QueueEmpty`` when empty) and raises
  ``MixedSyncAsyncAPIError`` once the queue is tainted. ``_SyncQueue.get(timeout)`` polls
  ``unsafe_get`` every 10 ms, which taints the queue, and at the deadline falls off its
  loop and **returns ``None``** instead of raising ``queue.Empty``; with ``timeout=0`` it
  returns ``None`` at once. ``_SyncQueue.put`` raises ``EventLoopShutdownError`` when the
  loop it was made on is not running. Its loop is the loop running where it was made.
- ``IterationResult`` (``tensorrt_llm/executor/result.py`` at ``005bc848``): an
  ``AsyncQueue`` when a loop runs at creation (``has_event_loop()``), else a
  ``queue.Queue``. ``get_results()`` loops ``json.loads(self.queue.get(timeout=...))``
  and catches only ``queue.Empty``, setting ``_done``; while ``_done`` every call returns
  ``[]`` at once, until ``mark_undone()``. ``__anext__`` raises ``StopAsyncIteration``
  while ``_done``, else awaits ``aqueue.get(timeout=self._timeout)`` and, on
  ``asyncio.TimeoutError`` only, sets ``_done`` (so ``timeout=0`` raises ``QueueEmpty``
  out of the ``async for``).
- ``GenerationExecutor`` (``tensorrt_llm/executor/executor.py`` at ``ed53795b``, the same
  at ``005bc848``): the one statistics ``IterationResult`` is made by the first
  ``generate_async`` (in the caller's thread, so on the caller's loop if one runs) and
  every later ``generate_async`` calls its ``mark_undone()``; ``get_stats(timeout)`` sets
  its timeout and returns ``get_results()``, ``aget_stats(timeout)`` sets it and returns
  the object itself (``LLM.get_stats_async``, ``tensorrt_llm/llmapi/llm.py`` at
  ``4c05a748``). Before any ``generate_async`` both return nothing.
- The delay: the worker's statistics thread sleeps 0.2 s per round before it fetches the
  iterations' statistics and queues them (``_iteration_result_task``,
  ``tensorrt_llm/executor/worker.py`` at ``005bc848``), and the proxy of a multi-process
  LLM sleeps another 0.2 s before forwarding them (``tensorrt_llm/executor/proxy.py`` at
  ``005bc848``; older stored versions sleep 0.1 s in both). ``StatsDispatcher`` sleeps a
  configurable ``delay_s`` the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import time
import warnings
from collections import deque
from collections.abc import AsyncIterator
from typing import Any


class EventLoopShutdownError(Exception):
    """``AsyncQueue.EventLoopShutdownError``: a put after the queue's loop stopped."""


class MixedSyncAsyncAPIError(Exception):
    """``AsyncQueue.MixedSyncAsyncAPIError``: an async get after a sync one tainted it."""


def has_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class AsyncQueue:
    """A deque with an event; made on (and bound to) the running loop."""

    def __init__(self) -> None:
        self._q: deque[Any] = deque()
        self._event = asyncio.Event()
        self._tainted = False
        self.sync_q = _SyncQueue(self)

    def put_nowait(self, item: Any) -> None:
        self._q.append(item)

    def notify(self) -> None:
        if self._q:
            self._event.set()

    def unsafe_get(self) -> Any:
        self._tainted = True
        try:
            return self._q.popleft()
        except IndexError:
            raise asyncio.QueueEmpty() from None

    async def get(self, timeout: float | None = None) -> Any:
        if self._tainted:
            raise MixedSyncAsyncAPIError()
        if timeout is None:
            while not self._q:
                await self._event.wait()
        elif timeout > 0:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not self._q:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError()
                await asyncio.wait_for(self._event.wait(), timeout=remaining)
        elif not self._q:
            raise asyncio.QueueEmpty()
        item = self._q.popleft()
        if not self._q:
            self._event.clear()
        return item


class _SyncQueue:
    """The sync face of an ``AsyncQueue``, for threads other than its loop's."""

    def __init__(self, aq: AsyncQueue) -> None:
        self._aq = aq
        self.loop = asyncio.get_running_loop()

    def put(self, item: Any) -> None:
        self._aq.put_nowait(item)
        if not self.loop.is_running():
            raise EventLoopShutdownError()
        try:
            self.loop.call_soon_threadsafe(self._aq.notify)
        except RuntimeError:  # closed between the check and the call
            raise EventLoopShutdownError() from None

    def get(self, timeout: float | None = None) -> Any:
        warnings.warn(
            "LLM API is running in async mode because you have a running event loop, "
            "but you are using sync API. This may lead to potential performance loss.",
            stacklevel=2,
        )
        deadline = None if timeout is None else time.time() + timeout
        while deadline is None or time.time() < deadline:
            try:
                return self._aq.unsafe_get()
            except asyncio.QueueEmpty:
                time.sleep(0.01)
        return None  # as in TensorRT-LLM: the deadline passes without a raise


class IterationResult:
    """The statistics singleton: a sync ``get_results`` and an async iteration, sharing
    the ``_done`` latch."""

    def __init__(self) -> None:
        self._done = False
        self._timeout: float | None = 2
        self.aqueue: AsyncQueue | None
        self.queue: _SyncQueue | queue.Queue[Any]
        if has_event_loop():
            self.aqueue = AsyncQueue()
            self.queue = self.aqueue.sync_q
        else:
            self.queue = queue.Queue()
            self.aqueue = None

    def set_timeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def mark_undone(self) -> None:
        self._done = False

    def get_results(self) -> list[dict[str, Any]]:
        results = []
        while not self._done:
            try:
                data = self.queue.get(timeout=self._timeout)
                results.append(json.loads(data))
            except queue.Empty:
                self._done = True
        return results

    def __aiter__(self) -> IterationResult:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._done:
            raise StopAsyncIteration
        assert self.aqueue is not None, (
            "The asyncio event loop was not present during initialization, so async "
            "operations are not available."
        )
        try:
            data = await self.aqueue.get(timeout=self._timeout)
            return dict(json.loads(data))
        except TimeoutError:
            self._done = True
            raise StopAsyncIteration from None

    def deliver(self, data: str) -> None:
        """From the statistics thread, as the worker queues one entry."""
        if isinstance(self.queue, _SyncQueue):
            # The worker logs a stopped loop and carries on.
            with contextlib.suppress(EventLoopShutdownError):
                self.queue.put(data)
        else:
            self.queue.put(data)


async def empty_async_iterable() -> AsyncIterator[dict[str, Any]]:
    """What ``get_stats_async`` returns before any request was submitted."""
    for item in ():
        yield item


class StatsDispatcher:
    """The worker's statistics thread: every ``delay_s`` seconds, hands every iteration
    entry recorded since its last round to the ``IterationResult`` ``target()`` returns
    (entries recorded while there is none are dropped, as there is no queue yet)."""

    def __init__(self, delay_s: float, target: Any) -> None:
        self._delay_s = delay_s
        self._target = target
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-stats", daemon=True)
        self._thread.start()

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._pending.append(json.dumps(entry))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._delay_s):
            with self._lock:
                entries, self._pending = self._pending, []
            result = self._target()
            if result is None:
                continue
            for entry in entries:
                result.deliver(entry)
