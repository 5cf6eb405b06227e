"""Requests whose constraint is compiling (vLLM's ``WAITING_FOR_FSM``): their own state
beside the scheduler, so a slow or hostile spec never holds up the engine thread or any
other request.

``ConstraintCompiles`` owns this state; the scheduler calls it through named hooks (check
at submission, start a compile, poll at the start of each step, cancel on abort or
shedding) and never reaches into it. Compiles run on a small pool of worker threads
(``concurrent.futures``) through the executor's ``ConstraintBackend``; each has a hard
deadline (``compile_timeout_s`` after submission) on the engine's clock, and a spec over
``max_spec_bytes`` is never compiled. A request leaves with its handle (then it joins the
waiting queue) or with an error naming the problem and the API field it came from.

A thread cannot be killed: a compile past its deadline keeps its worker until the
backend returns (the backend bounds its own work: llguidance's parser limits), but its
request has already ended, and its late result is dropped.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import NamedTuple

from orchestrator.core.config import ConstraintsConfig
from orchestrator.core.constraint import ConstraintBackend, ConstraintKind, ConstraintSpec
from orchestrator.core.errors import AdmissionError
from orchestrator.core.request import Request, RequestStatus

# The ``RequestOutput.error_code`` of a request whose constraint did not compile.
INVALID_CONSTRAINT = "invalid_constraint"
# How many recent compile times the expected compile time is the median of.
COMPILE_TIME_WINDOW = 64
# Longest backend message quoted in an error (a grammar library may echo the spec).
MAX_ERROR_CHARS = 600

# What each kind's value is called in an error message.
_NOUNS = {
    ConstraintKind.JSON_SCHEMA: "JSON schema",
    ConstraintKind.JSON_OBJECT: "JSON object constraint",
    ConstraintKind.REGEX: "regular expression",
    ConstraintKind.CHOICE: "choice list",
    ConstraintKind.GRAMMAR: "grammar",
}


class CompileOutcome(NamedTuple):
    """A request whose compile ended: ``error`` is ``None`` when it compiled (its
    ``constraint_handle`` is set), else why not (``source: ...``)."""

    request: Request
    error: str | None


class _Compile(NamedTuple):
    request: Request
    deadline: float  # engine clock, seconds
    future: Future[tuple[object, float]] | None  # None: failed before it started
    error: str | None


def _timed_compile(backend: ConstraintBackend, spec: ConstraintSpec) -> tuple[object, float]:
    """The handle and the compile's duration (s, measured on the worker thread)."""
    start = time.perf_counter()
    handle = backend.compile_constraint(spec)
    return handle, time.perf_counter() - start


class ConstraintCompiles:
    """The compiling requests and what their compiles took.

    ``backend`` is the executor's grammar backend (``None``: it enforces no constraint)
    and ``kinds`` the constraint kinds it enforces. Not thread-safe: the engine thread
    calls every method; only the compiles themselves run elsewhere.
    """

    def __init__(
        self,
        config: ConstraintsConfig,
        backend: ConstraintBackend | None = None,
        kinds: Iterable[ConstraintKind] = (),
    ) -> None:
        self.config = config
        self.backend = backend
        self.kinds = frozenset(kinds) if backend is not None else frozenset()
        self._compiles: dict[str, _Compile] = {}
        self._seconds: deque[float] = deque(maxlen=COMPILE_TIME_WINDOW)
        self._pool: ThreadPoolExecutor | None = None  # started by the first compile

    def __len__(self) -> int:
        return len(self._compiles)

    def check(self, request: Request) -> None:
        """At submission: raise ``AdmissionError`` (naming the spec's API field) when the
        executor cannot enforce the request's constraint. Never silently ignored."""
        spec = request.constraint
        if spec is None or spec.kind in self.kinds:
            return
        enforced = ", ".join(sorted(k.value for k in self.kinds))
        detail = f"it enforces only {enforced}" if enforced else "it enforces no constraints"
        raise AdmissionError(
            f"{spec.source}: the executor cannot enforce a {spec.kind.value} constraint ({detail})",
            param=spec.source,
        )

    def start(self, request: Request, now: float) -> None:
        """Begin compiling an accepted request's constraint (``now``: seconds, engine
        clock); the request is ``WAITING_FOR_GRAMMAR`` until ``poll`` returns it. A spec
        over the size limit fails at the next ``poll`` without being compiled."""
        spec = request.constraint
        assert spec is not None and self.backend is not None, "check() admits only these"
        request.status = RequestStatus.WAITING_FOR_GRAMMAR
        deadline = now + self.config.compile_timeout_s
        size, limit = len(spec.value.encode()), self.config.max_spec_bytes
        if size > limit:
            error = (
                f"{spec.source}: the {_NOUNS[spec.kind]} is {size:,} bytes, over the "
                f"{limit:,}-byte limit (scheduler.constraints.max_spec_bytes)"
            )
            self._compiles[request.request_id] = _Compile(request, deadline, None, error)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.config.compile_workers, thread_name_prefix="constraint-compile"
            )
        future = self._pool.submit(_timed_compile, self.backend, spec)
        self._compiles[request.request_id] = _Compile(request, deadline, future, None)

    def poll(self, now: float) -> list[CompileOutcome]:
        """The requests whose compile ended by ``now`` (seconds, engine clock): compiled,
        failed, over the size limit, or past their deadline (then cancelled). Each is
        returned once and forgotten here."""
        done: list[CompileOutcome] = []
        for rid, c in list(self._compiles.items()):
            spec = c.request.constraint
            assert spec is not None
            if c.future is None:
                error: str | None = c.error
            elif c.future.done():
                error = self._finished(c.request, spec, c.future)
            elif now >= c.deadline:
                c.future.cancel()
                error = (
                    f"{spec.source}: the {_NOUNS[spec.kind]} did not compile within "
                    f"{self.config.compile_timeout_s:.1f} s"
                )
            else:
                continue
            del self._compiles[rid]
            done.append(CompileOutcome(c.request, error))
        return done

    def _finished(
        self, request: Request, spec: ConstraintSpec, future: Future[tuple[object, float]]
    ) -> str | None:
        try:
            handle, seconds = future.result()
        except Exception as err:  # the backend's report of a bad spec, whatever its type
            text = str(err) or type(err).__name__
            if len(text) > MAX_ERROR_CHARS:
                text = text[:MAX_ERROR_CHARS] + "..."
            return f"{spec.source}: the {_NOUNS[spec.kind]} did not compile: {text}"
        self._seconds.append(seconds)
        request.constraint_handle = handle
        return None

    def cancel(self, request_id: str) -> bool:
        """Forget a compiling request (aborted or shed); its compile, if still queued,
        never starts, and a running one's result is dropped. Whether it was compiling."""
        c = self._compiles.pop(request_id, None)
        if c is None:
            return False
        if c.future is not None:
            c.future.cancel()
        return True

    def wait(self, timeout_s: float) -> None:
        """Block until a compile ends or ``timeout_s`` (s) passes: the engine calls it
        when nothing else can run, instead of spinning on empty steps."""
        futures = [c.future for c in self._compiles.values() if c.future is not None]
        if len(futures) == len(self._compiles):  # none is ready to report already
            wait(futures, timeout_s, return_when=FIRST_COMPLETED)

    def expected_s(self, request: Request) -> float:
        """The compile time (s) a request is expected to wait before it can be scheduled:
        0 without a constraint, else the median of the recent compiles (0 before any).
        SLO admission adds it to the request's TTFT prediction."""
        if request.constraint is None or not self._seconds:
            return 0.0
        return statistics.median(self._seconds)

    def shutdown(self) -> None:
        """Stop the workers; queued compiles are cancelled, running ones not waited for."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
