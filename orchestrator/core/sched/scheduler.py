"""Iteration-level scheduler (Orca) over a paged KV cache (vLLM) with chunked prefill
under a token budget (Sarathi-Serve), priorities with aging, and preemption by
recompute; docs/architecture.md ("Scheduling, step by step") walks through a step.

The scheduler owns the mechanisms (``batching.Mechanisms``); a batching strategy
composes them into a step and an ordering policy ranks requests. Features with state
of their own are collaborators called through named hooks, each off by default:
admission (``admission.py``, through the read-only ``view.py``), SLO bookkeeping and
its step budget (``slo.py``), tenant fair share (``fair.py``) and grammar compiles
(``constraints.py``).
"""

from __future__ import annotations

import bisect

from orchestrator.core.config import SchedulerConfig
from orchestrator.core.errors import AdmissionError, OverloadedError
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import (
    RequestOutput,
    ScheduledRequest,
    SchedulerOutput,
    StepResult,
)
from orchestrator.core.predictor import LinearStepTimePredictor, StepTimePredictor
from orchestrator.core.request import FINISH_REASONS, Request, RequestStatus
from orchestrator.core.sched.admission import ADMISSION_POLICIES, check_fits
from orchestrator.core.sched.batching import BATCHING_STRATEGIES
from orchestrator.core.sched.constraints import INVALID_CONSTRAINT, ConstraintCompiles
from orchestrator.core.sched.fair import FairShare
from orchestrator.core.sched.ordering import make_ordering
from orchestrator.core.sched.preemption import kv_victim
from orchestrator.core.sched.queue import RequestQueue
from orchestrator.core.sched.room import RoomLog
from orchestrator.core.sched.slo import ArrivalRate, SloTracker, slo_step_budget
from orchestrator.core.sched.step import Outbox, StepState, error_output
from orchestrator.core.sched.waiting import WaitingQueue


class Scheduler:
    """Decides, each step, which requests run how many tokens.

    ``schedule(now)`` returns the step's plan; ``update(plan, result, now)`` applies what
    the executor did and returns one ``RequestOutput`` per request that produced a token
    or finished. Times are seconds on the engine's clock.

    ``predictor`` predicts step times for admission and the SLO budget (default: the
    online linear fit of ``config.predictor``; the engine feeds it measured steps).
    ``preempt_for_priority`` is the config's setting, or the ordering policy's default
    when the config leaves it unset. ``constraints`` compiles grammars (default: no
    backend, so constrained requests are refused)."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        max_model_len: int,
        predictor: StepTimePredictor | None = None,
        constraints: ConstraintCompiles | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.strategy = BATCHING_STRATEGIES[config.batching]()
        self.ordering = make_ordering(config)
        flag = config.preempt_for_priority
        self.preempt_for_priority = self.ordering.preempt_for_priority if flag is None else flag
        self.predictor: StepTimePredictor = (
            predictor if predictor is not None else LinearStepTimePredictor(config.predictor)
        )
        self.admission = ADMISSION_POLICIES[config.admission.type](config)
        self.slo = SloTracker(config)
        self.constraints = (
            constraints if constraints is not None else ConstraintCompiles(config.constraints)
        )
        fair = config.fair_share
        self.fair = FairShare(fair, self.ordering) if fair.enabled else None
        self.waiting: RequestQueue = (
            self.fair.queue if self.fair is not None else WaitingQueue(self.ordering)
        )
        self.running: list[Request] = []  # best first by ordering.running_key
        self.requests: dict[str, Request] = {}  # every waiting or running request
        self.num_preemptions = 0
        # When the last step's tokens were (or, on a virtual clock, will be) out: a
        # request submitted before then waits for that step to end.
        self.step_end_time = 0.0
        self.room = RoomLog()
        self._outbox = Outbox()

    def add_request(self, request: Request, now: float | None = None) -> None:
        """Queue a request, or raise with nothing queued: ``AdmissionError`` when it can
        never be served (or names an unknown SLO class), ``OverloadedError`` when the
        admission policy refuses it now. Its class: its own, else ``default_slo_class``
        (the gateway puts a tenant's default class on the submission). ``now``
        (seconds) is the submission time (default: the request's arrival). A constrained
        request waits for its grammar (``WAITING_FOR_GRAMMAR``) before it is queued."""
        if request.request_id in self.requests:
            raise AdmissionError(f"request id {request.request_id!r} is already in use")
        check_fits(request, self.kv, self.max_model_len, self.config, self.strategy.chunks_prefill)
        self.constraints.check(request)
        self.slo.on_submit(request)
        now = request.arrival_time if now is None else now
        try:
            self.admission.admit(self, request, now)
        except OverloadedError as err:
            self.slo.on_refused(request, err.code)
            raise
        self.requests[request.request_id] = request
        if request.constraint is None:
            request.status = RequestStatus.WAITING
            self.waiting.push(request)
        else:
            self.constraints.start(request, now)
        self.slo.on_queued(request)
        self.room.on_queued(now)
        if self.fair is not None:
            self.fair.on_submit(request)

    def admitted_rate(self, better_than: int | None = None) -> ArrivalRate:  # for the view
        return self.slo.admitted_rate(better_than)

    def abort(self, request_id: str, now: float) -> Request | None:
        """Remove a waiting or running request and free its blocks at once. Returns it, or
        ``None`` if no live request has that id."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self._unqueue(request)
        if self.fair is not None:
            self.fair.forget(request_id)
        self.kv.free(request)
        request.status = RequestStatus.FINISHED_ABORTED
        request.finish_time = now
        self._outbox.finished_ids.append(request_id)
        if not self.running and not self.waiting:
            self.room.on_idle(now)
        return request

    def _unqueue(self, request: Request) -> None:
        """Take a request that is not running out of the queue, or stop its compile."""
        if not self.constraints.cancel(request.request_id):
            self.waiting.remove(request)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.requests) or bool(self._outbox)

    # ------------------------------------------------------------------ scheduling

    def schedule(self, now: float) -> SchedulerOutput:
        """The plan for the next step; ``now`` is the step's start (seconds)."""
        if self.constraints:
            self._take_compiled(now)
        if self.slo.has_due(now):
            self._shed_late(now)
        step = StepState(self.step_budget())
        self.strategy.fill(self, step, now)
        self.room.on_step(
            now,
            step.budget > 0 and not self.waiting and len(self.running) < self.config.max_batch_size,
        )
        preempted_ids, finished_ids = self._outbox.take_ids()
        return SchedulerOutput(list(step.scheduled.values()), preempted_ids, finished_ids)

    def _take_compiled(self, now: float) -> None:
        """Queue the requests whose grammar compiled; end the others before any token."""
        for request, error in self.constraints.poll(now):
            if error is None:
                request.status = RequestStatus.WAITING
                self.waiting.push(request)
            else:
                self._end_unscheduled(request, now, error, INVALID_CONSTRAINT)

    def step_budget(self) -> int:
        """This step's token budget (tokens): ``max_num_tokens``, or with the SLO budget
        on, ``slo.slo_step_budget`` of the running requests."""
        if not self.config.slo_budget.enabled:
            return self.config.max_num_tokens
        return slo_step_budget(self.config, self.running, self.predictor)

    def _shed_late(self, now: float) -> None:
        """End the waiting requests without a token whose TTFT deadline passed more than
        ``admission.shed_after_deadline_s`` ago: they cannot meet their SLO, and running
        them would only delay requests that still can."""
        for request in self.slo.due(now, self.requests):
            self._unqueue(request)
            error = self.slo.shed_error(request, now)
            self._end_unscheduled(request, now, error, "ttft_deadline_passed")
        if not self.running and not self.waiting:
            self.room.on_idle(now)

    def _end_unscheduled(self, request: Request, now: float, error: str, code: str) -> None:
        """End a request that left the queue (or its compile) with ``error``."""
        if self.fair is not None:
            self.fair.forget(request.request_id)
        self._finish(request, RequestStatus.FINISHED_ERROR, now)
        self._outbox.outputs.append(error_output(request, error, code))

    def schedule_running(self, step: StepState, now: float) -> None:
        """Decode tokens for every running request first, then prefill chunks for the
        ones part-way through their prompt."""
        prefilling = []
        running = RequestStatus.RUNNING
        for request in list(self.running):
            if request.status is not running:
                continue  # preempted earlier in this loop
            known = len(request.prompt_token_ids) + len(request.output_token_ids)
            if known - request.num_computed_tokens > 1:
                prefilling.append(request)
            elif step.budget > 0:
                self._schedule_or_preempt(step, request, 1, now)
        for request in prefilling:
            if step.budget == 0:
                break
            if request.status == RequestStatus.RUNNING:
                n = self._chunk(request.num_uncomputed_tokens, step.budget)
                if n > 0:
                    self._schedule_or_preempt(step, request, n, now)

    def _chunk(self, remaining: int, budget: int) -> int:
        """The next prefill chunk of a prompt with ``remaining`` uncomputed tokens, in
        ``budget`` tokens: at most ``chunk_size``, and a multiple of ``chunk_unit`` unless
        it is the prompt's last (0: no chunk fits this step)."""
        n = min(remaining, self.config.chunk_size, budget)
        if n < remaining:
            n -= n % self.config.chunk_unit
        return n

    def _schedule_or_preempt(self, step: StepState, request: Request, n: int, now: float) -> None:
        """Give ``request`` ``n`` tokens, preempting others (or itself) until its blocks fit."""
        while (table := self.kv.allocate(request, n)) is None:
            victim = kv_victim(self.running, request, self.config.max_preemptions)
            self.preempt(step, victim, now)
            step.kv_preempted = True
            if victim is request:
                return
        self._add_to_plan(step, request, n, table)

    def admit_waiting(self, step: StepState, now: float, whole_prompts: bool) -> bool:
        """Admit waiting requests in policy order with a first chunk each (the whole
        prompt if ``whole_prompts``). Returns whether any was admitted."""
        cfg = self.config
        deferred = []
        admitted = False
        kv = self.kv
        while step.budget > 0 and len(self.running) < cfg.max_batch_size:
            request = self.waiting.peek()
            if request is None:
                break
            if request.request_id in step.preempted:
                deferred.append(self.waiting.pop())
                continue
            prefix = kv.find_cached_prefix(request)
            remaining = request.num_tokens - len(prefix) * kv.block_size
            if whole_prompts:
                if remaining > step.budget:
                    break
                n = remaining
            else:
                n = self._chunk(remaining, step.budget)
                if n == 0:
                    break
            need = kv.blocks_for(len(prefix) * kv.block_size + n) - len(prefix)
            if not kv.can_admit(need, len(self.running)):
                break
            table = kv.allocate(request, n, prefix)
            if table is None:
                break
            self.waiting.pop()
            request.num_computed_tokens = len(prefix) * kv.block_size
            if request.first_scheduled_time is None:
                request.num_cached_prompt_tokens = request.num_computed_tokens
                if self.fair is not None:
                    self.fair.on_first_admit(request)
            self.start_running(request, now)
            self._add_to_plan(step, request, n, table)
            admitted = True
        for request in deferred:
            self.waiting.push(request)
        return admitted

    def start_running(self, request: Request, now: float) -> None:
        """Move an admitted request into the running set (best first)."""
        request.status = RequestStatus.RUNNING
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
        bisect.insort(self.running, request, key=self.ordering.running_key)

    def _add_to_plan(
        self, step: StepState, request: Request, n: int, table: tuple[int, ...]
    ) -> None:
        """Plan ``n`` tokens of ``request`` over ``table``, the block table ``allocate``
        just returned for them."""
        start = request.num_computed_tokens
        rid = request.request_id
        step.scheduled[rid] = ScheduledRequest(
            request_id=rid,
            token_ids=request.token_ids(start, start + n),
            start_position=start,
            block_table=table,
            sampling=request.sampling,
            sample=start + n == len(request.prompt_token_ids) + len(request.output_token_ids),
            priority=request.priority,
            slo_class=request.slo_class,
            tenant=request.tenant,
            arrival_time=request.arrival_time,
            constraint=request.constraint_handle,
        )
        step.budget -= n

    def preempt(self, step: StepState, request: Request, now: float) -> None:
        """Recompute-mode preemption: free the blocks, keep the tokens, requeue."""
        self.running.remove(request)
        planned = step.scheduled.pop(request.request_id, None)
        if planned is not None:
            step.budget += planned.num_tokens
        self.kv.free(request, keep_hashes=True)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push(request)
        self._outbox.preempted_ids.append(request.request_id)
        step.preempted.add(request.request_id)

    # ------------------------------------------------------------------ results

    def update(self, plan: SchedulerOutput, result: StepResult, now: float) -> list[RequestOutput]:
        """Apply a step's result: advance computed tokens, append sampled tokens, finish
        requests that hit a stop token or their length limit (freeing their blocks).
        ``now`` is when the step's tokens became available."""
        self.step_end_time = now
        outputs = self._outbox.take_outputs() if self._outbox.outputs else []
        if result.kv_free_blocks is not None:
            self.kv.observe_executor_free(result.kv_free_blocks)
        if self._apply(plan, result, now, outputs):
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
            if not self.running and not self.waiting:
                self.room.on_idle(now)
        if self.fair is not None:
            self.fair.on_outputs(outputs)
        return outputs

    def _apply(
        self, plan: SchedulerOutput, result: StepResult, now: float, outputs: list[RequestOutput]
    ) -> bool:
        """``update``'s loop, appending to ``outputs``; whether a request finished. Inline
        throughout: a method call per request per step is measurable here."""
        finished = False
        sampled, all_logprobs, failed = result.sampled, result.logprobs, result.failed
        requests, running, block_size = self.requests, RequestStatus.RUNNING, self.kv.block_size
        for planned in plan.scheduled:
            rid = planned.request_id
            request = requests.get(rid)
            if request is None or request.status is not running:
                continue  # aborted while the step ran
            if failed and rid in failed:
                self._finish(request, RequestStatus.FINISHED_ERROR, now)
                outputs.append(error_output(request, failed[rid]))
                finished = True
                continue
            before = request.num_computed_tokens
            request.num_computed_tokens = after = before + len(planned.token_ids)
            if after // block_size != before // block_size:  # a block filled up
                self.kv.commit(request)
            if not planned.sample:
                continue
            token = sampled.get(rid)
            if token is None:
                raise RuntimeError(f"executor returned no token for {rid!r}, which samples")
            output_ids = request.output_token_ids
            output_ids.append(token)
            if request.first_token_time is None:
                request.first_token_time = now
                if request.predicted_ttft_s is not None:
                    self.slo.on_first_token(request, now)
            n_prompt, n_out = len(request.prompt_token_ids), len(output_ids)
            sampling = request.sampling
            if token in sampling.stop_token_ids:
                status: RequestStatus | None = RequestStatus.FINISHED_STOPPED
            elif n_out >= sampling.max_tokens or n_out + n_prompt >= self.max_model_len:
                status = RequestStatus.FINISHED_LENGTH
            else:
                status = None
            if status is not None:
                self._finish(request, status, now)
                finished = True
            logprobs = all_logprobs.get(rid) if all_logprobs else None
            outputs.append(
                RequestOutput(
                    request_id=rid,
                    new_token_ids=(token,),
                    new_logprobs=(logprobs,) if logprobs is not None else (),
                    finished=status is not None,
                    finish_reason=FINISH_REASONS.get(status) if status is not None else None,
                    num_prompt_tokens=n_prompt,
                    num_output_tokens=n_out,
                    first_scheduled_time=request.first_scheduled_time,
                    num_cached_tokens=request.num_cached_prompt_tokens,
                )
            )
        return finished

    def _finish(self, request: Request, status: RequestStatus, now: float) -> None:
        request.status = status
        request.finish_time = now
        self.kv.free(request)
        self.slo.on_finished(request)
        del self.requests[request.request_id]
        self._outbox.finished_ids.append(request.request_id)
