"""asyncio front of the engine, for whatever serves requests from an event loop (our
gateway, the Dynamo worker): ``EngineCore.step()`` runs in one background thread, and
each request's outputs reach the event loop as an async stream of its own.

The core is not thread-safe, so the engine thread is the only one that touches it:
submissions and aborts are queued to it and applied between steps. Results travel back
with ``loop.call_soon_threadsafe``, so a step never blocks the event loop and streams are
only touched on the loop's thread. When there is nothing to do the engine thread waits
on a condition variable (no polling).

Failure isolation: a request the engine ends with an error raises
``RequestFailedError`` in that request's stream only. An exception of any type while the
engine thread applies one request's submission rejects that request alone
(``SubmissionFailedError``), and one while applying an abort is logged; neither stops
the loop. Only a failing ``step()`` (the executor, or the scheduler's shared state) stops
it: every live request, and any later submission, then gets ``EngineDeadError``.
Messages of these errors are safe to show a client; the internal details are logged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.core import (
    AdmissionError,
    Clock,
    EngineCore,
    EngineDeadError,
    EngineError,
    EngineStats,
    FinishReason,
    RequestOutput,
    Submission,
)

logger = logging.getLogger(__name__)


class RequestFailedError(EngineError):
    """The engine ended this request with an error (or aborted it on its own); requests
    sharing the batch are unaffected. ``detail`` is the engine's own reason, for logs."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


class RequestShedError(EngineError):
    """The engine chose to end this request before its first token (``code`` says why,
    e.g. ``ttft_deadline_passed``: it could no longer meet its SLO class's TTFT target).
    The message is the engine's own explanation, safe to show the client."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


INVALID_CONSTRAINT = "invalid_constraint"  # the engine's error_code for a bad constraint


class InvalidConstraintError(EngineError):
    """The engine could not use this request's constraint (it failed to compile, is
    too large, or compiling it timed out); it ended the request before any token.
    The message is the engine's, naming the problem; ``param`` is the request field
    the constraint came from, where the caller knows it. (The core's ``ConstraintError``
    is what a grammar backend raises while compiling; this is what the request's stream
    raises to its reader afterwards.)"""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class SubmissionFailedError(EngineError):
    """Applying this request's submission raised an unexpected error; the request was
    not queued and the engine runs on. The cause is logged, not carried."""


class RequestAbortedError(EngineError):
    """Someone other than the stream's consumer aborted the request (``AsyncEngine.abort``
    with this error): the consumer's iteration ends with it instead of waiting on."""


@dataclass(frozen=True, slots=True)
class _Add:
    request: Submission


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


class RequestStream:
    """The outputs of one request, in order, as an async iterator.

    Iteration ends after the output with ``finished=True``. It raises an ``EngineError``
    if the engine fails the request (``RequestFailedError``), stops (``EngineDeadError``)
    or drops it on shutdown. ``close()`` (also on leaving ``async with``) aborts a request
    that has not finished: a consumer that stops reading, or is cancelled, frees the
    request's KV blocks before the engine's next step.
    """

    def __init__(self, request_id: str, abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._abort = abort
        self._queue: asyncio.Queue[RequestOutput | EngineError] = asyncio.Queue()
        self._peeked: RequestOutput | None = None
        self.finished = False

    def put(self, item: RequestOutput | EngineError) -> None:
        """Deliver an output or an error (event loop thread only)."""
        self._queue.put_nowait(item)

    def __aiter__(self) -> RequestStream:
        return self

    async def peek(self) -> RequestOutput:
        """Wait for the first output without consuming it (iteration returns it
        first); raises as iteration would. Lets a caller learn that the engine took
        the request (or why not) before it commits to a response."""
        if self._peeked is None:
            self._peeked = await self.__anext__()
        return self._peeked

    async def __anext__(self) -> RequestOutput:
        if self._peeked is not None:
            peeked, self._peeked = self._peeked, None
            return peeked
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, EngineError):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
            if item.finish_reason is FinishReason.ERROR and item.error_code == INVALID_CONSTRAINT:
                raise InvalidConstraintError(item.error or "the constraint could not be used")
            if item.finish_reason is FinishReason.ERROR and item.error_code is not None:
                raise RequestShedError(
                    item.error or "the engine ended this request", item.error_code
                )
            if item.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
                raise RequestFailedError(
                    "the engine could not complete this request",
                    detail=f"{item.finish_reason}: {item.error or 'no reason given'}",
                )
        return item

    def close(self) -> None:
        """Abort the request unless it has finished. Idempotent."""
        if not self.finished:
            self.finished = True
            self._abort(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class AsyncEngine:
    """Runs an ``EngineCore`` in a background thread and serves it to coroutines.

    ``start()`` must be called on the event loop that will use the engine. The engine owns
    the core from then on: ``shutdown()`` stops the thread and shuts the executor down.
    """

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._cond = threading.Condition()
        self._inbox: list[_Add | _Abort] = []  # guarded by _cond
        self._stopping = False  # guarded by _cond
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Event-loop thread only:
        self._streams: dict[str, RequestStream] = {}
        self._admissions: dict[str, asyncio.Future[None]] = {}
        # Written by the engine thread, read anywhere (reference assignment is atomic).
        self._stats: EngineStats = core.stats()
        self._dead: EngineDeadError | None = None
        self.crashed = asyncio.Event()  # set on the loop once step() has raised

    @property
    def clock(self) -> Clock:
        """The core's clock; request arrival and token times use it (seconds)."""
        return self.core.clock

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens one request may hold."""
        return self.core.max_model_len

    @property
    def is_running(self) -> bool:
        """True while the engine thread runs and accepts requests."""
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    @property
    def num_live_requests(self) -> int:
        """Requests submitted and not yet finished, aborted or failed."""
        return len(self._streams)

    def stats(self) -> EngineStats:
        """The core's counters as of the end of the last step (or the last abort)."""
        return self._stats

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine is already started")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    async def submit(self, request: Submission) -> RequestStream:
        """Queue ``request``; return its output stream once the core has accepted it.

        Raises ``AdmissionError`` or ``OverloadedError`` (nothing is queued),
        ``SubmissionFailedError`` (the core raised anything else; nothing is queued) or
        ``EngineDeadError``. Admission waits at most one engine step.
        """
        if self._dead is not None:
            raise self._dead
        if self._loop is None or not self.is_running:
            raise EngineDeadError("the engine is not running")
        request_id = request.request_id
        if request_id in self._streams:
            raise AdmissionError(f"request id {request_id!r} is already in use")
        stream = RequestStream(request_id, self.abort)
        admitted: asyncio.Future[None] = self._loop.create_future()
        self._streams[request_id] = stream
        self._admissions[request_id] = admitted
        self._send(_Add(request))
        try:
            await admitted
        except BaseException:
            self._streams.pop(request_id, None)
            self._admissions.pop(request_id, None)
            if not admitted.done() or admitted.cancelled():
                # Cancelled while waiting: the core may accept it after all.
                self._send(_Abort(request_id))
            raise
        return stream

    def abort(self, request_id: str, error: EngineError | None = None) -> None:
        """Stop a request before the engine's next step (its KV blocks are then free); its
        stream gets nothing more, or ``error``, which ends its consumer's iteration (for
        an abort its consumer did not ask for). Unknown ids are ignored."""
        stream = self._streams.pop(request_id, None)
        if stream is not None and error is not None:
            stream.put(error)
        self._send(_Abort(request_id))

    def abort_all(self, error: EngineError) -> None:
        """Abort every live request, ending each stream with ``error`` (e.g. at the end
        of a drain). The engine keeps running."""
        for request_id in list(self._streams):
            self.abort(request_id, error)

    async def shutdown(self) -> None:
        """Stop the engine thread (after the step in flight), fail live requests with
        ``EngineDeadError`` and shut the executor down."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        self._fail_all(EngineDeadError("the engine has shut down"))
        self.core.shutdown()

    # ------------------------------------------------------------------ engine thread

    def _send(self, command: _Add | _Abort) -> None:
        with self._cond:
            self._inbox.append(command)
            self._cond.notify()

    def _run(self) -> None:
        core = self.core
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._stopping or core.has_work()):
                        self._cond.wait()
                    if self._stopping:
                        return
                    commands, self._inbox = self._inbox, []
                self._apply(commands)
                step = core.step() if core.has_work() else None
                # Counters before outputs, so a client holding its last token also sees
                # the engine's state after that step (e.g. on /metrics).
                self._stats = core.stats()
                if step is not None and step.outputs:
                    self._to_loop(self._deliver, step.outputs)
        except Exception:
            logger.exception("the engine loop crashed")
            self._log_state()
            dead = EngineDeadError("the engine stopped after an internal error")
            self._dead = dead
            self._to_loop(self._crash, dead)

    def _log_state(self) -> None:
        """Log, once as the loop dies, what the engine was doing (vLLM's engine dumps
        its state the same way), so a crash report carries the scheduler's last plan."""
        try:
            logger.error("engine state when the loop crashed: %s", self.core.dump_state())
        except Exception:
            logger.exception("the engine state could not be read after the crash")

    def _apply(self, commands: list[_Add | _Abort]) -> None:
        """Apply submissions and aborts. Whatever one of them raises concerns that
        request alone, so it never propagates to the step loop."""
        for command in commands:
            if isinstance(command, _Abort):
                try:
                    self.core.abort(command.request_id)
                except Exception:
                    logger.exception("aborting request %s failed", command.request_id)
                continue
            request_id = command.request.request_id
            error: EngineError | None = None
            try:
                self.core.add_request(command.request)
            except EngineError as err:
                error = err
            except Exception:
                logger.exception("the engine could not accept request %s", request_id)
                error = SubmissionFailedError("the engine could not accept this request")
                self._discard(request_id)
            self._to_loop(self._admit, request_id, error)

    def _discard(self, request_id: str) -> None:
        """Drop whatever a failed submission may have left in the core, so it neither
        runs nor holds KV blocks."""
        try:
            self.core.abort(request_id)
        except Exception:
            logger.exception("cleaning up after request %s failed", request_id)

    def _to_loop(self, callback: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            logger.debug("event loop closed; dropped %s", callback.__name__)

    # ------------------------------------------------------------------ event-loop thread

    def _admit(self, request_id: str, error: EngineError | None) -> None:
        admitted = self._admissions.pop(request_id, None)
        if admitted is None or admitted.done():
            return
        if error is None:
            admitted.set_result(None)
        else:
            admitted.set_exception(error)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue  # aborted by its consumer while the step ran
            stream.put(output)
            if output.finished:
                del self._streams[output.request_id]

    def _crash(self, error: EngineDeadError) -> None:
        self._fail_all(error)
        self.crashed.set()

    def _fail_all(self, error: EngineDeadError) -> None:
        for admitted in self._admissions.values():
            if not admitted.done():
                admitted.set_exception(error)
        self._admissions.clear()
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()
