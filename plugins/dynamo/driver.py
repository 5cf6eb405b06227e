"""The engine core served to the worker's coroutines: one step at a time, each on a
worker thread (``asyncio.to_thread``), so the event loop Dynamo's runtime shares with us
never blocks on a forward pass.

The core is not thread-safe. Only the driver's task touches it: submissions and aborts
wait in lists and are applied between steps, on the loop's thread, while no step runs.
Each request's outputs reach its consumer through an ``asyncio.Queue``. Failure
isolation follows the gateway's ``AsyncEngine`` (plug-ins may not import the gateway):
an error while applying one submission rejects that request alone, one while aborting
is logged, and only a failing step stops the engine, failing every live request with
``EngineDeadError``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from orchestrator.core import (
    EngineCore,
    EngineDeadError,
    EngineError,
    EngineStats,
    RequestOutput,
    Submission,
)

logger = logging.getLogger(__name__)


class RequestAbortedError(EngineError):
    """The request was aborted (``CoreDriver.abort``); its consumer ends it."""


class SubmissionFailedError(EngineError):
    """Applying this request's submission raised an unexpected error; it was not queued
    and the engine runs on. The cause is logged, not carried."""


@dataclass(eq=False)
class _Pending:
    submission: Submission
    admitted: asyncio.Future[asyncio.Queue[RequestOutput | EngineError]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class CoreDriver:
    """Runs ``core``'s steps while it has work, from ``start()`` until ``shutdown()``.

    ``submit`` returns the request's output queue once the core accepted it; the queue
    yields ``RequestOutput``s up to the finished one, or ends with an ``EngineError``:
    ``RequestAbortedError`` after ``abort``, ``EngineDeadError`` when the engine died.
    """

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._pending: list[_Pending] = []
        self._aborts: list[str] = []
        self._queues: dict[str, asyncio.Queue[RequestOutput | EngineError]] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._stats: EngineStats = core.stats()
        self.dead: EngineDeadError | None = None
        self.crashed = asyncio.Event()  # set once a step has raised

    @property
    def num_live_requests(self) -> int:
        """Requests accepted and not yet finished or aborted."""
        return len(self._queues)

    def stats(self) -> EngineStats:
        """The core's counters as of the end of the last step (or abort)."""
        return self._stats

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, submission: Submission) -> asyncio.Queue[RequestOutput | EngineError]:
        """Queue ``submission``; raises the core's ``AdmissionError``/``OverloadedError``
        (nothing queued), ``SubmissionFailedError`` or ``EngineDeadError``."""
        if self.dead is not None:
            raise self.dead
        if self._stopping:
            raise EngineDeadError("the engine is shutting down")
        pending = _Pending(submission)
        self._pending.append(pending)
        self._wake.set()
        return await pending.admitted

    def abort(self, request_id: str) -> None:
        """Drop a request before the next step (its KV blocks are then free); a consumer
        waiting on its queue gets ``RequestAbortedError``. Unknown ids are ignored."""
        queue = self._queues.pop(request_id, None)
        if queue is not None:
            queue.put_nowait(RequestAbortedError(f"request {request_id} was aborted"))
            self._aborts.append(request_id)
            self._wake.set()

    async def shutdown(self) -> None:
        """Stop after the step in flight, fail live requests and shut the executor down."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        self._apply_aborts()
        self._fail_all(EngineDeadError("the engine has shut down"))
        self.core.shutdown()

    async def _run(self) -> None:
        core = self.core
        while not self._stopping:
            self._apply()
            if not core.has_work():
                self._wake.clear()
                if not (self._pending or self._aborts or self._stopping):
                    await self._wake.wait()
                continue
            try:
                step = await asyncio.to_thread(core.step)
            except Exception:
                logger.exception("the engine loop crashed")
                self.dead = EngineDeadError("the engine stopped after an internal error")
                self._fail_all(self.dead)
                self.crashed.set()
                return
            self._stats = core.stats()
            for output in step.outputs:
                queue = self._queues.get(output.request_id)
                if queue is None:
                    continue  # aborted while the step ran
                queue.put_nowait(output)
                if output.finished:
                    del self._queues[output.request_id]

    def _apply(self) -> None:
        """Apply aborts, then submissions; whatever one raises concerns that request."""
        self._apply_aborts()
        pending, self._pending = self._pending, []
        for item in pending:
            request_id = item.submission.request_id
            if item.admitted.done():  # its submitter was cancelled
                continue
            if request_id in self._queues:
                item.admitted.set_exception(
                    SubmissionFailedError(f"request id {request_id!r} is already in use")
                )
                continue
            try:
                self.core.add_request(item.submission)
            except EngineError as err:
                item.admitted.set_exception(err)
                continue
            except Exception:
                logger.exception("the engine could not accept request %s", request_id)
                item.admitted.set_exception(
                    SubmissionFailedError("the engine could not accept this request")
                )
                continue
            queue: asyncio.Queue[RequestOutput | EngineError] = asyncio.Queue()
            self._queues[request_id] = queue
            item.admitted.set_result(queue)

    def _apply_aborts(self) -> None:
        aborts, self._aborts = self._aborts, []
        for request_id in aborts:
            try:
                self.core.abort(request_id)
            except Exception:
                logger.exception("aborting request %s failed", request_id)
        if aborts:
            self._stats = self.core.stats()

    def _fail_all(self, error: EngineDeadError) -> None:
        for item in self._pending:
            if not item.admitted.done():
                item.admitted.set_exception(error)
        self._pending.clear()
        for queue in self._queues.values():
            queue.put_nowait(error)
        self._queues.clear()
