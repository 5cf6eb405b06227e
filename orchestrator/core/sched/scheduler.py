"""Iteration-level scheduler (Orca) over a paged KV cache (vLLM) with chunked prefill
under a token budget (Sarathi-Serve), priorities with aging, and preemption by
recompute.

The scheduler owns the mechanisms; a batching strategy (``batching.py``) composes them
into a step and an ordering policy (``ordering.py``) ranks requests. The mechanisms:
- Priority preemption: if the best waiting request ranks strictly better than a running
  one and the batch is full (or its first chunk does not fit the KV pool), the worst
  running request yields.
- Running requests, best first, get their decode token; a request whose next block
  cannot be allocated preempts the worst running request below it (or itself). Then
  prefill chunks of at most ``chunk_size`` tokens go to running requests part-way
  through their prompt.
- Admission: waiting requests in policy order get a first chunk while the batch cap,
  the budget and the KV pool (with its headroom) allow. Admission stops at the first
  request that does not fit, so the policy order holds. Requests preempted in a step
  are not readmitted in the same step.

SLO features plug in beside them, each off by default: an admission policy
(``admission.py``) decides at submission; SLO classes give each request a TTFT deadline
and TPOT target; the SLO-derived budget (``step_budget``) shrinks a step's prefill so the
predicted step time stays under the tightest running TPOT target; shedding ends waiting
requests whose TTFT deadline has long passed; tenant fair share swaps the waiting queue
for ``fair.FairShareQueue``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque

from orchestrator.core.config import SchedulerConfig
from orchestrator.core.errors import AdmissionError, OverloadedError
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import (
    RequestOutput,
    ScheduledRequest,
    SchedulerOutput,
    StepResult,
)
from orchestrator.core.predictor import (
    ErrorWindow,
    LinearStepTimePredictor,
    StepTimePredictor,
    mixed_step,
)
from orchestrator.core.request import FINISH_REASONS, Request, RequestStatus
from orchestrator.core.sched.admission import ADMISSION_POLICIES
from orchestrator.core.sched.batching import BATCHING_STRATEGIES
from orchestrator.core.sched.fair import FairShareQueue
from orchestrator.core.sched.ordering import make_ordering
from orchestrator.core.sched.step import StepState
from orchestrator.core.sched.waiting import WaitingQueue


class Scheduler:
    """Decides, each step, which requests run how many tokens.

    ``schedule(now)`` returns the step's plan; ``update(plan, result, now)`` applies what
    the executor did and returns one ``RequestOutput`` per request that produced a token
    or finished. Times are seconds on the engine's clock.

    ``predictor`` predicts step times for admission and the SLO budget (default: the
    online linear fit of ``config.predictor``; the engine feeds it measured steps).
    ``tenant_classes`` maps a tenant to the SLO class of its requests that name none
    (``ServerConfig.tenant_slo_classes``); ``default_slo_class`` comes after it.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        max_model_len: int,
        predictor: StepTimePredictor | None = None,
        tenant_classes: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.tenant_classes = tenant_classes or {}
        self.kv = kv
        self.max_model_len = max_model_len
        self.strategy = BATCHING_STRATEGIES[config.batching]()
        self.ordering = make_ordering(config)
        self.predictor: StepTimePredictor = (
            predictor if predictor is not None else LinearStepTimePredictor(config.predictor)
        )
        self.admission = ADMISSION_POLICIES[config.admission.type](config)
        fair = config.fair_share
        self.fair: FairShareQueue | None = (
            FairShareQueue(self.ordering, dict(fair.tenant_weights)) if fair.enabled else None
        )
        self.waiting: WaitingQueue | FairShareQueue = (
            self.fair if self.fair is not None else WaitingQueue(self.ordering)
        )
        # Requests by id while fair share charges their output tokens.
        self._fair_requests: dict[str, Request] = {}
        self._slo_budget = config.slo_budget.enabled
        # Shedding: (TTFT deadline + slack, seq, request) of waiting requests with a class.
        self._shed_slack = config.admission.shed_after_deadline_s
        self._deadlines: list[tuple[float, int, Request]] = []
        self._deadline_seq = itertools.count()
        # Outputs made outside a step (requests shed while waiting), sent with the next.
        self._pending_outputs: list[RequestOutput] = []
        # Predicted-vs-actual TTFT, overall and per SLO class; refusals by (class, code).
        self.ttft_errors = ErrorWindow()
        self.ttft_errors_by_class: dict[str, ErrorWindow] = {}
        self.rejections: dict[tuple[str | None, str], int] = {}
        self.num_shed = 0
        # When the last step's tokens were (or, on a virtual clock, will be) out: a
        # request submitted before then waits for that step to end.
        self.step_end_time = 0.0
        # (arrival s, prompt tokens) of the last admitted requests: the admitted-token rate.
        self._recent_admits: deque[tuple[float, int]] = deque(maxlen=64)
        self.running: list[Request] = []  # best first by ordering.running_key
        self.requests: dict[str, Request] = {}  # every waiting or running request
        self.num_preemptions = 0
        # Ids whose blocks were freed since the last plan, reported in the next one.
        self._freed_ids: list[str] = []
        self._preempted_ids: list[str] = []
        self.priority_preemption = config.priority_preemption

    # ------------------------------------------------------------------ submission

    def add_request(self, request: Request, now: float | None = None) -> None:
        """Queue a request, or raise with nothing queued: ``AdmissionError`` when it can
        never be served (or names an unknown SLO class), ``OverloadedError`` when the
        admission policy refuses it now. Its class: its own, else its tenant's default,
        else ``default_slo_class``. ``now`` (seconds) is the submission time
        (default: the request's arrival)."""
        self.check_admissible(request)
        name = request.slo_class
        if name is None and request.tenant is not None:
            name = self.tenant_classes.get(request.tenant)
        if name is None:
            name = self.config.default_slo_class
        if name is not None and name not in self.config.slo_classes:
            known = ", ".join(self.config.slo_classes) or "none configured"
            raise AdmissionError(
                f"slo_class: unknown SLO class {name!r}; known: {known}", param="slo_class"
            )
        self.assign_class(request, name)
        try:
            self.admission.admit(self, request, request.arrival_time if now is None else now)
        except OverloadedError as err:
            key = (request.slo_class, err.code)
            self.rejections[key] = self.rejections.get(key, 0) + 1
            raise
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.push(request)
        self._recent_admits.append((request.arrival_time, request.num_prompt_tokens))
        if self.fair is not None:
            self._fair_requests[request.request_id] = request
        if self._shed_slack is not None and request.slo_class is not None:
            heapq.heappush(
                self._deadlines,
                (request.ttft_deadline + self._shed_slack, next(self._deadline_seq), request),
            )

    def admitted_tokens_per_s(self) -> float:
        """Prompt tokens per second of the last (up to 64) admitted requests, by arrival
        time; 0 with fewer than two."""
        recent = self._recent_admits
        if len(recent) < 2:
            return 0.0
        span = recent[-1][0] - recent[0][0]
        return sum(n for _, n in list(recent)[1:]) / span if span > 0 else 0.0

    def assign_class(self, request: Request, name: str | None) -> None:
        """Give ``request`` SLO class ``name`` (a configured class, or ``None``): its TTFT
        deadline (arrival plus the class's target; the arrival without a class) and its
        TPOT target (s). Only for a request that is not queued yet: the deadline is part
        of its sort key."""
        request.slo_class = name
        if name is None:
            request.ttft_deadline, request.tpot_target_s = request.arrival_time, None
            return
        target = self.config.slo_classes[name]
        request.ttft_deadline = request.arrival_time + target.ttft_s
        request.tpot_target_s = target.tpot_s

    def check_admissible(self, request: Request) -> None:
        """Raise ``AdmissionError`` if the request could never run to completion."""
        if request.request_id in self.requests:
            raise AdmissionError(f"request id {request.request_id!r} is already in use")
        n_prompt, max_tokens = request.num_prompt_tokens, request.sampling.max_tokens
        lifetime = n_prompt + max_tokens
        if lifetime > self.max_model_len:
            raise AdmissionError(
                f"prompt has {n_prompt} tokens and max_tokens is {max_tokens}: together "
                f"{lifetime}, over the model's maximum context of {self.max_model_len} tokens"
            )
        blocks = self.kv.blocks_for(lifetime)
        if blocks > self.kv.num_blocks:
            raise AdmissionError(
                f"prompt plus max_tokens ({lifetime} tokens) needs {blocks} KV blocks; "
                f"the KV pool holds {self.kv.num_blocks}"
            )
        if not self.strategy.chunks_prefill and lifetime > self.config.max_num_tokens:
            raise AdmissionError(
                f"without chunked prefill, prompt plus max_tokens ({lifetime} tokens) must "
                f"fit one step's budget (max_num_tokens={self.config.max_num_tokens})"
            )

    def abort(self, request_id: str, now: float) -> Request | None:
        """Remove a waiting or running request and free its blocks at once. Returns it, or
        ``None`` if no live request has that id."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._fair_requests.pop(request_id, None)
        self.kv.free(request)
        request.status = RequestStatus.FINISHED_ABORTED
        request.finish_time = now
        self._freed_ids.append(request_id)
        return request

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return (
            bool(self.requests)
            or bool(self._freed_ids)
            or bool(self._preempted_ids)
            or bool(self._pending_outputs)
        )

    # ------------------------------------------------------------------ scheduling

    def schedule(self, now: float) -> SchedulerOutput:
        """The plan for the next step; ``now`` is the step's start (seconds)."""
        if self._deadlines and self._deadlines[0][0] < now:
            self._shed_late(now)
        step = StepState(self.step_budget() if self._slo_budget else self.config.max_num_tokens)
        self.strategy.fill(self, step, now)
        plan = SchedulerOutput(
            scheduled=list(step.scheduled.values()),
            preempted_ids=self._preempted_ids,
            finished_ids=self._freed_ids,
        )
        self._preempted_ids, self._freed_ids = [], []
        return plan

    def step_budget(self) -> int:
        """This step's token budget (tokens): ``max_num_tokens``, or with the SLO budget
        on, the running requests' decode tokens plus the largest prefill for which the
        predicted step time stays within ``slo_budget.margin`` x the tightest TPOT
        target among running requests (at least ``min_prefill_tokens``, at most
        ``max_num_tokens`` in all). A binary search over the prefill size: about a dozen
        predictions per step."""
        cfg = self.config
        if not self._slo_budget:
            return cfg.max_num_tokens
        targets = [r.tpot_target_s for r in self.running if r.tpot_target_s is not None]
        if not targets:
            return cfg.max_num_tokens
        limit = min(targets) * cfg.slo_budget.margin
        decodes = len(self.running)
        context = sum(r.num_computed_tokens for r in self.running)
        predict, chunk = self.predictor.predict, cfg.chunk_size
        lo, hi = 0, cfg.max_num_tokens - decodes
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if predict(mixed_step(decodes, context, mid, math.ceil(mid / chunk))) <= limit:
                lo = mid
            else:
                hi = mid - 1
        prefill = max(lo, cfg.slo_budget.min_prefill_tokens)
        return max(1, min(cfg.max_num_tokens, decodes + prefill))

    def _shed_late(self, now: float) -> None:
        """End the waiting requests without a token whose TTFT deadline passed more than
        ``admission.shed_after_deadline_s`` ago: they cannot meet their SLO, and running
        them would only delay requests that still can."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < now:
            _, _, request = heapq.heappop(deadlines)
            live = self.requests.get(request.request_id) is request
            if (
                not live
                or request.status == RequestStatus.RUNNING
                or request.first_token_time is not None
            ):
                continue
            self.waiting.remove(request)
            self._fair_requests.pop(request.request_id, None)
            late_ms = (now - request.ttft_deadline) * 1e3
            target_ms = (request.ttft_deadline - request.arrival_time) * 1e3
            error = (
                f"ended before its first token: its TTFT deadline ({target_ms:,.0f} ms, SLO "
                f"class {request.slo_class!r}) passed {late_ms:,.0f} ms ago"
            )
            self._finish(request, RequestStatus.FINISHED_ERROR, now)
            self.num_shed += 1
            self._pending_outputs.append(self._error_output(request, error, "ttft_deadline_passed"))

    def schedule_running(self, step: StepState, now: float) -> None:
        """Decode tokens for every running request first, then prefill chunks for the
        ones part-way through their prompt."""
        prefilling = []
        running = RequestStatus.RUNNING
        for request in list(self.running):
            if request.status is not running:
                continue  # preempted earlier in this loop
            uncomputed = (
                len(request.prompt_token_ids)
                + len(request.output_token_ids)
                - request.num_computed_tokens
            )
            if uncomputed > 1:
                prefilling.append(request)
            elif step.budget > 0:
                self._schedule_or_preempt(step, request, 1, now)
        for request in prefilling:
            if step.budget == 0:
                break
            if request.status == RequestStatus.RUNNING:
                n = min(request.num_uncomputed_tokens, self.config.chunk_size, step.budget)
                self._schedule_or_preempt(step, request, n, now)

    def _schedule_or_preempt(self, step: StepState, request: Request, n: int, now: float) -> None:
        """Give ``request`` ``n`` tokens, preempting others (or itself) until its blocks fit."""
        while self.kv.allocate(request, n) is None:
            victim = self._choose_victim(request)
            self._preempt(step, victim, now)
            step.kv_preempted = True
            if victim is request:
                return
        self._add_to_plan(step, request, n)

    def _choose_victim(self, request: Request) -> Request:
        """The running request to preempt so that ``request`` can grow.

        Prefer the worst request below it that is under the preemption cap, then itself,
        then any request under the cap; if every request is at the cap, progress wins
        over the cap and the worst other request yields."""
        cap = self.config.max_preemptions
        position = self.running.index(request)
        below = self.running[position + 1 :]
        for victim in reversed(below):
            if victim.num_preemptions < cap:
                return victim
        if request.num_preemptions < cap:
            return request
        for victim in reversed(self.running):
            if victim.num_preemptions < cap and victim is not request:
                return victim
        others = [r for r in self.running if r is not request]
        return others[-1] if others else request

    def preempt_for_priority(self, step: StepState, now: float) -> None:
        """Evict the worst running requests that rank below the best waiting one while
        the batch is full or its first chunk does not fit (when priority preemption is
        on)."""
        if not self.priority_preemption:
            return
        candidate = self.waiting.peek()
        if candidate is None:
            return
        first_chunk = min(candidate.num_tokens, self.config.chunk_size)
        cap = self.config.max_preemptions
        while self.running:
            batch_full = len(self.running) >= self.config.max_batch_size
            kv_short = self.kv.blocks_for(first_chunk) > self.kv.num_free_blocks
            if not (batch_full or kv_short):
                return
            victim = next(
                (
                    r
                    for r in reversed(self.running)
                    if r.priority > candidate.priority and r.num_preemptions < cap
                ),
                None,
            )
            if victim is None:
                return
            self._preempt(step, victim, now)

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
                n = min(remaining, cfg.chunk_size, step.budget)
            need = kv.blocks_for(len(prefix) * kv.block_size + n) - len(prefix)
            if not kv.can_admit(need, len(self.running)):
                break
            if kv.allocate(request, n, prefix) is None:
                break
            self.waiting.pop()
            request.num_computed_tokens = len(prefix) * kv.block_size
            if request.first_scheduled_time is None:
                request.num_cached_prompt_tokens = request.num_computed_tokens
                if self.fair is not None:
                    weight = cfg.fair_share.input_weight
                    self.fair.charge(request, weight * request.num_prompt_tokens)
            self._start_running(request, now)
            self._add_to_plan(step, request, n)
            admitted = True
        for request in deferred:
            self.waiting.push(request)
        return admitted

    def admit_static_batch(self, now: float) -> None:
        """Admit up to ``max_batch_size`` requests whose whole-lifetime KV fits together."""
        free = self.kv.num_free_blocks
        while len(self.running) < self.config.max_batch_size:
            request = self.waiting.peek()
            if request is None:
                break
            remaining_out = request.sampling.max_tokens - request.num_output_tokens
            need = self.kv.blocks_for(request.num_tokens + remaining_out)
            if need > free:
                break
            free -= need
            self.waiting.pop()
            self.kv.allocate(request, 0, self.kv.find_cached_prefix(request))
            request.num_computed_tokens = len(self.kv.block_table(request.request_id)) * (
                self.kv.block_size
            )
            self._start_running(request, now)

    def _start_running(self, request: Request, now: float) -> None:
        request.status = RequestStatus.RUNNING
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
        bisect.insort(self.running, request, key=self.ordering.running_key)

    def _add_to_plan(self, step: StepState, request: Request, n: int) -> None:
        start = request.num_computed_tokens
        rid = request.request_id
        step.scheduled[rid] = ScheduledRequest(
            rid,
            request.token_ids(start, start + n),
            start,
            self.kv.block_table_snapshot(rid),
            start + n == len(request.prompt_token_ids) + len(request.output_token_ids),
            request.sampling,
        )
        step.budget -= n

    def _preempt(self, step: StepState, request: Request, now: float) -> None:
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
        self._preempted_ids.append(request.request_id)
        step.preempted.add(request.request_id)

    # ------------------------------------------------------------------ results

    def update(self, plan: SchedulerOutput, result: StepResult, now: float) -> list[RequestOutput]:
        """Apply a step's result: advance computed tokens, append sampled tokens, finish
        requests that hit a stop token or their length limit (freeing their blocks).
        ``now`` is when the step's tokens became available."""
        outputs: list[RequestOutput] = []
        self.step_end_time = now
        if self._pending_outputs:
            outputs, self._pending_outputs = self._pending_outputs, []
        finished = False
        sampled, all_logprobs, failed = result.sampled, result.logprobs, result.failed
        if result.kv_free_blocks is not None:
            self.kv.observe_executor_free(result.kv_free_blocks)
        block_size = self.kv.block_size
        requests, running = self.requests, RequestStatus.RUNNING
        for planned in plan.scheduled:
            rid = planned.request_id
            request = requests.get(rid)
            if request is None or request.status is not running:
                continue  # aborted while the step ran
            if failed and rid in failed:
                outputs.append(self._fail(request, failed[rid], now))
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
                    self._observe_ttft(request, now)
            # The stop test inline: a method call per request per step is measurable here.
            n_prompt, n_out, sampling = (
                len(request.prompt_token_ids),
                len(output_ids),
                request.sampling,
            )
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
                    rid,
                    (token,),
                    (logprobs,) if logprobs is not None else (),
                    status is not None,
                    FINISH_REASONS.get(status) if status is not None else None,
                    n_prompt,
                    n_out,
                    None,
                    request.first_scheduled_time,
                    request.num_cached_prompt_tokens,
                )
            )
        if finished:
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        if self.fair is not None:
            self._charge_outputs(outputs)
        return outputs

    def _charge_outputs(self, outputs: list[RequestOutput]) -> None:
        """Fair share: charge each output token to its tenant."""
        fair, weight = self.fair, self.config.fair_share.output_weight
        assert fair is not None
        for out in outputs:
            request = self._fair_requests.get(out.request_id)
            if request is None:
                continue
            if out.new_token_ids:
                fair.charge(request, weight * len(out.new_token_ids))
            if out.finished:
                del self._fair_requests[out.request_id]

    def _observe_ttft(self, request: Request, now: float) -> None:
        predicted, actual = request.predicted_ttft_s, now - request.arrival_time
        assert predicted is not None
        self.ttft_errors.observe(predicted, actual)
        if request.slo_class is not None:
            window = self.ttft_errors_by_class.setdefault(request.slo_class, ErrorWindow())
            window.observe(predicted, actual)

    def _fail(self, request: Request, error: str, now: float) -> RequestOutput:
        self._finish(request, RequestStatus.FINISHED_ERROR, now)
        return self._error_output(request, error)

    def _error_output(self, request: Request, error: str, code: str | None = None) -> RequestOutput:
        return RequestOutput(
            request.request_id,
            (),
            (),
            True,
            FINISH_REASONS[RequestStatus.FINISHED_ERROR],
            len(request.prompt_token_ids),
            len(request.output_token_ids),
            error,
            request.first_scheduled_time,
            request.num_cached_prompt_tokens,
            code,
        )

    def _finish(self, request: Request, status: RequestStatus, now: float) -> None:
        request.status = status
        request.finish_time = now
        self.kv.free(request)
        del self.requests[request.request_id]
        self._freed_ids.append(request.request_id)
