"""Fault injection for the serving stack: an executor wrapper that breaks on purpose.

``FaultyExecutor`` wraps any executor and, per its ``Faults``, raises from ``execute``
on a chosen step (the executor itself is broken: the engine must stop), reports chosen
requests in ``StepResult.failed`` (one request's failure: only it may end), or stalls a
chosen step for some seconds (a hung device). Requests are chosen by the first token of
their prompt, since the gateway makes request ids up; with ``WordTokenizer`` a prompt
that starts with ``w999`` starts with token 999.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from orchestrator.core import Executor, ExecutorInfo, SchedulerOutput, StepResult

FAIL_MARKER = 999  # token id that marks a request to fail (the word ``w999``)


class InjectedFault(RuntimeError):
    """What a ``FaultyExecutor`` raises when told to break."""


@dataclass
class Faults:
    """What to break. Steps count every ``execute`` call from 1.

    ``raise_on_step``: raise ``InjectedFault`` from that step (and every later one).
    ``fail_marker``: fail requests whose prompt starts with this token, on the
    ``fail_after_steps``-th step they are scheduled in (1: their first).
    ``stall_on_step``/``stall_s``: sleep that long before running that step.
    """

    raise_on_step: int | None = None
    fail_marker: int | None = None
    fail_after_steps: int = 1
    stall_on_step: int | None = None
    stall_s: float = 0.0


@dataclass
class FaultLog:
    """What the wrapper did, for assertions (guarded by ``lock``)."""

    steps: int = 0
    failed: list[str] = field(default_factory=list)
    stalled_steps: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class FaultyExecutor:
    """An ``Executor`` that delegates to ``inner`` and breaks as ``faults`` say."""

    def __init__(self, inner: Executor, faults: Faults) -> None:
        self.inner = inner
        self.faults = faults
        self.log = FaultLog()
        self._marked: dict[str, int] = {}  # request id -> steps it was scheduled in

    def info(self) -> ExecutorInfo:
        return self.inner.info()

    def execute(self, plan: SchedulerOutput) -> StepResult:
        f = self.faults
        with self.log.lock:
            self.log.steps += 1
            step = self.log.steps
        if f.stall_on_step == step:
            with self.log.lock:
                self.log.stalled_steps.append(step)
            time.sleep(f.stall_s)
        if f.raise_on_step is not None and step >= f.raise_on_step:
            raise InjectedFault(f"injected executor failure at step {step}")
        doomed = self._doomed(plan)
        result = self.inner.execute(plan)
        if not doomed:
            return result
        with self.log.lock:
            self.log.failed += doomed
        failed = {**result.failed, **{rid: "injected request failure" for rid in doomed}}
        sampled = {rid: t for rid, t in result.sampled.items() if rid not in doomed}
        logprobs = {rid: lp for rid, lp in result.logprobs.items() if rid not in doomed}
        return StepResult(sampled, result.duration_s, logprobs, failed, result.cost)

    def _doomed(self, plan: SchedulerOutput) -> list[str]:
        """Marked requests in this plan that reach their failing step now."""
        f = self.faults
        if f.fail_marker is None:
            return []
        doomed = []
        for s in plan.scheduled:
            if s.start_position == 0 and s.token_ids and s.token_ids[0] == f.fail_marker:
                self._marked.setdefault(s.request_id, 0)
            if s.request_id in self._marked:
                self._marked[s.request_id] += 1
                if self._marked[s.request_id] == f.fail_after_steps:
                    doomed.append(s.request_id)
        return doomed

    def shutdown(self) -> None:
        self.inner.shutdown()
