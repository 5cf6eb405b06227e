"""Discrete-event driver: the real ``EngineCore`` on a virtual clock.

Events sit in a heap of ``(time, order, seq, handler, payload)``. An arrival routes a
request to a replica and wakes it if idle; a replica with work steps at once: at
virtual time ``t`` it calls ``core.step()`` and its completion becomes an event at
``t + step.duration_s``, when the step's tokens are recorded (their timestamps are the
core's own, ``start_time + duration_s``), finished requests are closed and the replica
steps again. Arrivals sort before completions at the same instant, so a request arriving
exactly when a step ends joins the next one. Nothing is random here: the workload fixed
every draw, so a run is deterministic for its workload's seed.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.common.deployment import Deployment
from orchestrator.common.metrics import RequestRecord
from orchestrator.common.workloads import RequestSpec, Workload
from orchestrator.core import (
    AdmissionError,
    EngineConfig,
    EngineCore,
    EngineStep,
    ModelStepTimePredictor,
    OverloadedError,
    RequestOutput,
    SamplingParams,
    StepTimePredictor,
    Submission,
    VirtualClock,
)
from orchestrator.sim.router import Router

# Synthetic prompt ids stay below the smallest vocabulary of the models in configs/.
PROMPT_VOCAB = 32_000

_ARRIVAL, _COMPLETION = 0, 1  # heap order at equal times


def synthetic_prompt(index: int, length: int) -> list[int]:
    """``length`` token ids unique to request ``index`` in their first two positions, so
    no two requests share a cached prefix (block hashes chain from the first block)."""
    tokens = [0] * length
    tokens[0] = index % PROMPT_VOCAB
    if length > 1:
        tokens[1] = index // PROMPT_VOCAB % PROMPT_VOCAB
    return tokens


def synthetic_prompt_of(spec: RequestSpec) -> list[int]:
    """The default prompt of a request: ``synthetic_prompt(spec.index, spec.prompt_len)``."""
    return synthetic_prompt(spec.index, spec.prompt_len)


# The prompt token ids of a request; exactly ``spec.prompt_len`` of them.
PromptFactory = Callable[[RequestSpec], Sequence[int]]


@dataclass(slots=True)
class StepTrace:
    """One replica's steps, in order: end time (s), duration (s), requests in the step,
    and the fraction of KV blocks held by live requests after it."""

    end_times: list[float] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    num_seqs: list[int] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Replica:
    """One engine and the driver's view of it."""

    core: EngineCore
    outstanding_tokens: int = 0
    busy: bool = False  # a step is in flight or queued to start
    trace: StepTrace = field(default_factory=StepTrace)
    # Seconds by cause (weights, kv, compute, comms, overhead), when the executor
    # explains its steps (the sim executor's ``last_cost``).
    time_by_cause: list[float] = field(default_factory=lambda: [0.0] * 5)

    # The gauges a replica exports on /metrics, which a router may read (router.Load).
    @property
    def num_waiting(self) -> int:
        return self.core.stats().num_waiting

    @property
    def num_running(self) -> int:
        return self.core.stats().num_running

    @property
    def kv_usage(self) -> float:
        stats = self.core.stats()
        return stats.kv_blocks_used / stats.kv_blocks_total


@dataclass(slots=True, eq=False)
class _Live:
    spec: RequestSpec
    arrival_time: float
    token_times: list[float] = field(default_factory=list)
    predicted_ttft: float | None = None


@dataclass(frozen=True)
class SimRun:
    """Everything a run produced. ``end_time`` is the virtual time of the last event
    (s); ``wall_time_s`` what the run took on this machine."""

    records: list[RequestRecord]
    replicas: list[Replica]
    end_time: float
    wall_time_s: float

    @property
    def num_steps(self) -> int:
        return sum(len(r.trace.durations) for r in self.replicas)

    @property
    def num_preemptions(self) -> int:
        return sum(r.core.stats().num_preemptions for r in self.replicas)


def step_time_predictor(config: EngineConfig) -> StepTimePredictor | None:
    """The exact predictor of a simulated deployment (its roofline cost model is the step
    time), or ``None`` for any other executor (the engine then fits one online)."""
    options = config.executor.options
    if not isinstance(options, Deployment):
        return None
    return ModelStepTimePredictor(options.cost_model().predict_s)


def build_replicas(config: EngineConfig, count: int, clock: VirtualClock) -> list[Replica]:
    """``count`` independent engines of ``config`` sharing one virtual clock."""
    return [
        Replica(EngineCore.from_config(config, clock=clock, predictor=step_time_predictor(config)))
        for _ in range(count)
    ]


class Simulation:
    """Serves ``workload`` with ``replicas`` behind ``router``; ``run()`` once."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        clock: VirtualClock,
        workload: Workload,
        router: Router,
        prompts: PromptFactory | None = None,
    ) -> None:
        if not replicas:
            raise ValueError("a simulation needs at least one replica")
        self.replicas = list(replicas)
        self.clock = clock
        self.workload = workload
        self.router = router
        self.prompts = prompts or synthetic_prompt_of
        self._events: list[tuple[float, int, int, Callable[[Any], None], Any]] = []
        self._seq = itertools.count()
        self._live: dict[str, _Live] = {}
        self._records: list[RequestRecord] = []
        self._pending = iter(workload.requests)  # closed loop: requests not yet sent

    def run(self) -> SimRun:
        started = time.perf_counter()
        wl = self.workload
        if wl.concurrency is None:
            for spec in wl.requests:
                self._push(spec.arrival_time, _ARRIVAL, self._arrive, spec)
        else:
            for spec in itertools.islice(self._pending, wl.concurrency):
                self._push(0.0, _ARRIVAL, self._arrive, spec)
        events = self._events
        clock = self.clock
        while events:
            t, _, _, handler, payload = heapq.heappop(events)
            clock.advance_to(t)
            handler(payload)
        self._close_unfinished()
        self._records.sort(key=lambda r: r.arrival_time)
        return SimRun(self._records, self.replicas, clock.now(), time.perf_counter() - started)

    def _push(self, t: float, order: int, handler: Callable[[Any], None], payload: Any) -> None:
        heapq.heappush(self._events, (t, order, next(self._seq), handler, payload))

    def _arrive(self, spec: RequestSpec) -> None:
        now = self.clock.now()
        prompt = tuple(self.prompts(spec))
        if len(prompt) != spec.prompt_len:
            raise ValueError(
                f"the prompt of request {spec.index} has {len(prompt)} tokens, "
                f"its spec says {spec.prompt_len}"
            )
        index = self.router.choose(self.replicas, prompt)
        replica = self.replicas[index]
        request = Submission(
            request_id=f"req-{spec.index}",
            prompt_token_ids=prompt,
            sampling=SamplingParams(max_tokens=spec.output_len, temperature=0.0),
            priority=spec.priority,
            arrival_time=now,
            slo_class=spec.slo_class,
            tenant=spec.tenant,
        )
        try:
            predicted = replica.core.add_request(request)
        except (AdmissionError, OverloadedError) as err:
            status = 400 if isinstance(err, AdmissionError) else 429
            self._records.append(
                RequestRecord(
                    request.request_id,
                    now,
                    (),
                    spec.prompt_len,
                    0,
                    str(err),
                    status_code=status,
                    error_code=err.code if isinstance(err, OverloadedError) else None,
                    slo_class=spec.slo_class,
                    tenant=spec.tenant,
                )
            )
            self._next_closed_loop_request()
            return
        self._live[request.request_id] = _Live(spec, now, predicted_ttft=predicted)
        replica.outstanding_tokens += spec.prompt_len + spec.output_len
        if not replica.busy:
            # Start once every arrival of this instant is queued, so they share a step.
            replica.busy = True
            self._push(now, _COMPLETION, self._wake, replica)

    def _wake(self, replica: Replica) -> None:
        replica.busy = False
        self._step(replica)

    def _step(self, replica: Replica) -> None:
        """Start a step on an idle replica; with nothing to run it stays idle until the
        next arrival."""
        core = replica.core
        if not core.has_work():
            return
        step = core.step()
        if not step.plan.scheduled:
            # Requests ended without running (shed past their deadline) still report.
            replica.outstanding_tokens -= self._record_outputs(step.outputs, step.start_time)
            return
        replica.busy = True
        end = step.start_time + step.duration_s
        cost = step.cost
        if cost is not None:
            causes = replica.time_by_cause
            for i, seconds in enumerate(cost.attributed()):
                causes[i] += seconds
        trace = replica.trace
        trace.end_times.append(end)
        trace.durations.append(step.duration_s)
        trace.num_seqs.append(len(step.plan.scheduled))
        stats = core.stats()
        trace.kv_usage.append(stats.kv_blocks_used / stats.kv_blocks_total)
        self._push(end, _COMPLETION, self._complete, (replica, step))

    def _complete(self, payload: tuple[Replica, EngineStep]) -> None:
        replica, step = payload
        replica.busy = False
        replica.outstanding_tokens -= self._record_outputs(
            step.outputs, step.start_time + step.duration_s
        )
        self._step(replica)

    def _record_outputs(self, outputs: list[RequestOutput], t: float) -> int:
        """Record a step's outputs, stamped ``t``; returns the outstanding tokens retired."""
        live = self._live
        done = 0
        for out in outputs:
            entry = live[out.request_id]
            times = entry.token_times
            if not times:
                done += entry.spec.prompt_len
            n_new = len(out.new_token_ids)
            if n_new == 1:  # the common case, without building a list
                times.append(t)
            else:
                times.extend([t] * n_new)
            done += n_new
            if out.finished:
                done += entry.spec.output_len - out.num_output_tokens
                del live[out.request_id]
                spec = entry.spec
                self._records.append(
                    RequestRecord(
                        out.request_id,
                        entry.arrival_time,
                        tuple(times),
                        out.num_prompt_tokens,
                        out.num_output_tokens,
                        error=out.error,
                        error_code=out.error_code,
                        slo_class=spec.slo_class,
                        tenant=spec.tenant,
                        predicted_ttft=entry.predicted_ttft,
                    )
                )
                self._next_closed_loop_request()
        return done

    def _next_closed_loop_request(self) -> None:
        """In a closed loop, the client whose request just ended sends its next one."""
        if self.workload.concurrency is None:
            return
        spec = next(self._pending, None)
        if spec is not None:
            t = self.clock.now() + self.workload.think_time_s
            self._push(t, _ARRIVAL, self._arrive, spec)

    def _close_unfinished(self) -> None:
        """Requests still live when no event is left could never run (e.g. a static
        batch that cannot form); they count as errors rather than vanish."""
        for rid, entry in self._live.items():
            self._records.append(
                RequestRecord(
                    rid,
                    entry.arrival_time,
                    tuple(entry.token_times),
                    entry.spec.prompt_len,
                    len(entry.token_times),
                    error="never finished",
                )
            )
        self._live.clear()


def simulate(
    engine: EngineConfig,
    workload: Workload,
    router: Router,
    replicas: int = 1,
    prompts: PromptFactory | None = None,
) -> SimRun:
    """Run ``workload`` on ``replicas`` copies of ``engine`` from virtual time 0; prompts
    come from ``prompts`` (default: ``synthetic_prompt_of``, no shared prefixes)."""
    clock = VirtualClock()
    return Simulation(
        build_replicas(engine, replicas, clock), clock, workload, router, prompts
    ).run()
