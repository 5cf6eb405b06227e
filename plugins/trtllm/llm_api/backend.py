"""Requests on ``LLM.generate_async`` streams, driven from the engine's thread.

A ``RequestOutput`` is iterated with ``async for`` on the event loop that was running
when ``generate_async`` made it (its queue is an asyncio queue only then), as
``trtllm-serve`` does. So the backend keeps one event loop on a thread of its own: each
submission calls ``generate_async`` there and starts a task that turns every streamed
output into an ``Update`` on a thread-safe queue, which ``poll`` reads on the engine's
thread. Aborts run on the loop too, and so does the statistics reader (``stats``), which
each submission re-arms. In in-executor mode, a request the worker's scheduler refuses
(``in_executor.refusals``) is ended here the same way: its stream gets a final update
with the refusal as its error, and it is aborted in TensorRT-LLM.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from plugins.trtllm.in_executor.facts import FactsSubmitter, RequestFacts
from plugins.trtllm.in_executor.refusals import RefusalChannel
from plugins.trtllm.llm_api import translate
from plugins.trtllm.llm_api.guided import Guide
from plugins.trtllm.llm_api.stats import KvStatsReader
from plugins.trtllm.llm_api.translate import ReleaseOptions
from plugins.trtllm.runner import Ask
from plugins.trtllm.streams import Update

T = TypeVar("T")

_SUBMIT_TIMEOUT_S = 60.0  # generate_async only queues the request; it returns at once
_STOP_GRACE_S = 5.0  # longest wait for the loop's cancelled tasks at stop
_CANCEL_RETRY_S = 0.1  # how often a task that survived its cancellation is cancelled again


class EventLoopThread:
    """An asyncio event loop running on a daemon thread until ``stop``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="trtllm-llmapi-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float = _SUBMIT_TIMEOUT_S) -> T:
        """Run ``fn(*args)`` on the loop (so it sees a running loop) and return its
        result, or raise what it raised."""
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as err:  # handed to the caller, not lost on the loop
                done.set_exception(err)

        self.loop.call_soon_threadsafe(run)
        return done.result(timeout=timeout_s)

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop without waiting for it."""
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        """Cancel the loop's tasks, stop it and wait for its thread; safe to call twice."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            # Let the cancelled tasks finish before the loop stops and closes, cancelling
            # again those still pending: before Python 3.12, asyncio.wait_for (which
            # TensorRT-LLM's AsyncQueue.get awaits) can swallow a cancellation that races
            # with its inner wait. After _STOP_GRACE_S the loop stops regardless.
            pending = {t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()}
            deadline = self.loop.time() + _STOP_GRACE_S
            while pending and self.loop.time() < deadline:
                for task in pending:
                    task.cancel()
                _, pending = await asyncio.wait(pending, timeout=_CANCEL_RETRY_S)
            self.loop.stop()

        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(cancel_all()))
        if threading.current_thread() is self._thread:
            return  # called from a task on the loop: it stops once this callback returns
        self._thread.join()
        self.loop.close()


class LlmApiBackend:
    """Submissions are our own counter; ``RequestOutput`` handles live on the loop.
    ``release`` says whether ``generate_async`` gets a priority. With ``facts`` (the
    in-executor mode's channel), each submission's priority, SLO class, tenant and
    arrival are registered under the request id ``generate_async``'s result carries
    (in one process before the worker's scheduler can read them; across processes
    sent right after, and the scheduler waits for them a bounded time). With ``refusals``, a refusal under that
    id ends the submission: a final ``Update`` whose ``error`` is the refusal (the runner
    names it in ``StepResult.failed``, so the core ends it with that error) and
    ``RequestOutput.abort()``, so TensorRT-LLM drops it too. Refusals of submissions
    already finished are ignored."""

    def __init__(
        self,
        llmapi: Any,
        llm: Any,
        loop: EventLoopThread,
        stats: KvStatsReader,
        release: ReleaseOptions,
        facts: FactsSubmitter | None = None,
        refusals: RefusalChannel | None = None,
    ) -> None:
        self._llmapi = llmapi
        self._facts = facts
        self._llm = llm
        self._loop = loop
        self._stats = stats
        self._release = release
        self._updates: queue.SimpleQueue[Update] = queue.SimpleQueue()
        self._handles: dict[int, Any] = {}  # touched on the loop's thread only
        self._by_request_id: dict[int, int] = {}  # RequestOutput.request_id: submission; loop only
        self._tasks: set[asyncio.Task[None]] = set()
        self._next = 1
        if refusals is not None:
            refusals.listen(self._refused)

    def submit(self, ask: Ask) -> int:
        guide = ask.constraint if isinstance(ask.constraint, Guide) else None
        params = translate.sampling_params(
            self._llmapi, ask.sampling, ask.max_tokens, ask.seed, guide
        )
        options: dict[str, Any] = {}
        if self._release.passes_priority:
            options["priority"] = translate.llm_priority(ask.priority)
        submission, self._next = self._next, self._next + 1
        facts = RequestFacts(ask.priority, ask.slo_class, ask.tenant, ask.arrival_time)
        self._loop.call(self._start, submission, list(ask.tokens), params, options, facts)
        return submission

    def cancel(self, submission: int) -> None:
        self._loop.soon(self._abort, submission)

    def poll(self, timeout_s: float) -> list[Update]:
        try:
            first = (
                self._updates.get(timeout=timeout_s)
                if timeout_s > 0
                else self._updates.get_nowait()
            )
        except queue.Empty:
            return []
        updates = [first]
        while True:
            try:
                updates.append(self._updates.get_nowait())
            except queue.Empty:
                return updates

    # ------------------------------------------------------------------ on the loop

    def _start(
        self,
        submission: int,
        tokens: list[int],
        params: Any,
        options: dict[str, Any],
        facts: RequestFacts,
    ) -> None:
        if self._facts is None:
            output = self._generate(tokens, params, options)
        else:
            with self._facts.submitting() as staged:
                output = self._generate(tokens, params, options)
                staged[int(output.request_id)] = facts
        self._stats.rearm()  # the submission lifted TensorRT-LLM's statistics latch
        self._handles[submission] = output
        self._by_request_id[int(output.request_id)] = submission
        task = asyncio.get_running_loop().create_task(self._pump(submission, output))
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)

    def _generate(self, tokens: list[int], params: Any, options: dict[str, Any]) -> Any:
        return self._llm.generate_async(tokens, sampling_params=params, streaming=True, **options)

    async def _pump(self, submission: int, output: Any) -> None:
        final = False
        try:
            async for streamed in output:
                update = translate.update_from(submission, streamed)
                final = update.final
                self._updates.put(update)
            if not final:
                self._updates.put(Update(submission, final=True, finish_reason="ended"))
        except Exception as err:  # TensorRT-LLM's failure of this one request
            self._updates.put(Update(submission, final=True, error=f"{type(err).__name__}: {err}"))
        finally:
            self._handles.pop(submission, None)
            self._by_request_id.pop(int(output.request_id), None)

    def _abort(self, submission: int) -> None:
        output = self._handles.get(submission)
        if output is not None and not output.finished:
            output.abort()

    def _refused(self, request_id: int, reason: str) -> None:
        """The worker's scheduler refused ``request_id`` (called on its executor thread,
        so the work is handed to the loop, in order after the submission's ``_start``)."""
        self._loop.soon(self._end_refused, request_id, reason)

    def _end_refused(self, request_id: int, reason: str) -> None:
        submission = self._by_request_id.get(request_id)
        if submission is None:
            return  # finished (or never ours): nothing left to end
        # Queued before any later update of the submission: its stream ends with this.
        self._updates.put(Update(submission, final=True, error=reason))
        self._abort(submission)
