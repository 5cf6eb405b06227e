"""Our core's ``Scheduler`` as TensorRT-LLM's ``RequestScheduler``.

``PyExecutor._schedule`` calls ``scheduler.schedule_request(active_requests,
inflight_req_ids)`` once per iteration and reads the ``SchedulerOutput`` namedtuple it
returns (``tensorrt_llm/_torch/pyexecutor/scheduler.py`` at ``034fffb0`` on the 1.2
line; ``tensorrt_llm/_torch/pyexecutor/scheduler/scheduler.py`` at ``002f3cc3`` on the
1.3 line, where the tuple gains ``encoder_requests`` first and
``scheduled_mm_encoder_items`` last). Then it pauses ``paused_requests``
(``req.pause(max_input_len)`` and frees their KV), allocates KV for the context and
generation requests, runs the forward pass and samples. So each call here is the
boundary between two iterations; it:

1. applies the previous iteration to the core (``EngineCore.finish_step``, the second
   half of ``EngineCore.step``): each planned request that sampled gets the token its
   ``LlmRequest`` gained, and the step's duration feeds the step-time predictor;
   requests TensorRT-LLM ended or cancelled (gone from ``active_requests``) are aborted;
   requests the core ended with an error of its own (shed, failed) are ended in
   TensorRT-LLM through the refusal sink, as refused requests are;
2. queues requests it has not seen (``EngineCore.add_request``), with the facts the
   facts source holds for them (priority, SLO class, tenant, arrival); a request whose
   facts have not arrived (possible only when they travel from another process) is
   held out of the schedule, holding no KV, for at most the source's
   ``facts_wait_s``, then queued with the defaults (logged); a request
   the core refuses is named, with the core's reason, on the refusal sink, whose
   listener (the submitting side) ends it with that error and aborts it in
   TensorRT-LLM; until it leaves ``active_requests`` it is never scheduled;
3. plans (``EngineCore.plan_step``, the first half of ``EngineCore.step``: ordering,
   token budget with the SLO budget, chunked prefill, preemption, the same scheduler
   and policies as every other executor);
4. returns the plan as TensorRT-LLM's output: context requests with
   ``context_chunk_size`` set to our chunk, generation requests, our preemptions that
   hold KV in TensorRT-LLM as ``paused_requests``; an empty output while requests are
   active first waits up to ``IDLE_WAIT_S`` (TensorRT-LLM's loop would call again at
   once).

The core's KV manager mirrors TensorRT-LLM's (``in_loop_engine``:
``ExecutorInfo.mirrors_executor_kv``): TensorRT-LLM's ``max_num_blocks`` blocks, a
sequence's known tokens allocated whole on its first chunk as ``prepare_resources``
does (``add_sequence(py_request_id, prompt_len)``, ``resource_manager.py``), prefix
caching off (block reuse is off in this mode). Each iteration TensorRT-LLM's own free
count is handed to it after the core has freed what ended (``observe_executor_free``),
so neither admission nor allocation counts on blocks TensorRT-LLM does not have.

The core reads no token value inside the executor: stop tokens end requests in
TensorRT-LLM's own sampler, and the core learns of it when the request leaves
``active_requests`` (it reaches ``max_tokens`` itself at the same step). It does need
each step's token to be visible at the next call, so the overlap scheduler (which copies
tokens to the host an iteration late) is refused at installation. Requests are named
``str(py_request_id)`` in the core; facts are looked up by ``py_client_id`` (the id the
LLM API's result carries), else ``py_request_id``.

Not thread-safe: the executor's loop thread calls it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core import (
    AdmissionError,
    Clock,
    EngineConfig,
    EngineCore,
    EngineStep,
    ExecutorInfo,
    FinishReason,
    OverloadedError,
    SamplingParams,
    SchedulerOutput,
    StepResult,
    StepTimePredictor,
    Submission,
)
from plugins.trtllm.errors import TrtllmError
from plugins.trtllm.in_executor.facts import FactsSource, RequestFacts
from plugins.trtllm.in_executor.ranks import Decision, RankLink
from plugins.trtllm.in_executor.refusals import RefusalSink

logger = logging.getLogger(__name__)

# The SchedulerOutput fields this adapter fills, by name; any other field of a release's
# tuple keeps its namedtuple default, and one without a default is refused by the version
# gate (install.check_interface).
KNOWN_OUTPUT_FIELDS = frozenset(
    {
        "encoder_requests",
        "context_requests",
        "generation_requests",
        "paused_requests",
        "fitting_disagg_gen_init_requests",
        "num_fitting_requests",
        "scheduled_mm_encoder_items",
    }
)


# The longest the scheduler blocks TensorRT-LLM's loop in an iteration that schedules
# nothing while requests are active (seconds). TensorRT-LLM's fetch waits for new
# requests only when active_requests is empty (_fetch_new_requests: timeout None, else
# 0; py_executor.py at 9521caf4), so with only refused or held requests active the loop
# would spin at full speed; a submission through our backend (its facts) ends the wait
# at once, a request submitted by other code waits at most this long to be seen.
IDLE_WAIT_S = 0.01


class AdapterError(RuntimeError):
    """TensorRT-LLM's requests and the core's plan disagree (a bug, never bad input)."""


@dataclass(frozen=True)
class TrtllmTypes:
    """What the adapter uses of the installed release: the ``SchedulerOutput``
    namedtuple class and the ``LlmRequestState`` members it compares with."""

    output_type: Any
    context_init: Any
    generation_in_progress: Any
    generation_complete: Any


class KvSource:
    """TensorRT-LLM's KV manager as the adapter reads it: ``get_kv_cache_stats()``
    (``max_num_blocks``, ``free_num_blocks``, ``tokens_per_block``), the call
    ``PyExecutor``'s iteration statistics make."""

    def __init__(self, kv_cache_manager: Any) -> None:
        self._kv = kv_cache_manager

    def free_blocks(self) -> int:
        return int(self._kv.get_kv_cache_stats().free_num_blocks)


class LoopExecutor:
    """The ``Executor`` an in-loop ``EngineCore`` is built with: ``info()`` describes
    TensorRT-LLM's KV pool; plans run in TensorRT-LLM's own loop, which drives
    ``plan_step`` and ``finish_step``, so ``execute`` is refused."""

    def __init__(self, info: ExecutorInfo) -> None:
        self._info = info

    def info(self) -> ExecutorInfo:
        return self._info

    def execute(self, plan: SchedulerOutput) -> StepResult:
        raise TrtllmError("in-executor scheduling: TensorRT-LLM's loop runs the plans")

    def shutdown(self) -> None:
        """Nothing to release: TensorRT-LLM owns the loop."""


def in_loop_engine(
    config: EngineConfig,
    num_blocks: int,
    max_model_len: int,
    clock: Clock,
    predictor: StepTimePredictor | None = None,
) -> EngineCore:
    """The ``EngineCore`` whose scheduler runs inside TensorRT-LLM's loop: ``config``'s
    scheduler and cache settings (prefix caching off, chunks aligned to the KV block as
    TensorRT-LLM aligns its own) over ``num_blocks`` KV blocks that
    mirror TensorRT-LLM's manager; ``max_model_len`` in tokens."""
    cache = config.cache.model_copy(update={"enable_prefix_caching": False})
    model = config.model.model_copy(update={"max_model_len": max_model_len})
    # TensorRT-LLM's own chunking makes every chunk but a prompt's last a multiple of its
    # chunk unit, the KV block size (_torch/pyexecutor/_util.py: chunk_unit_size =
    # tokens_per_block; microBatchScheduler.cpp, FIRST_COME_FIRST_SERVED, at 0a949d31):
    # the chunks its model engine runs. Ours keep to the same rule. (A sliding attention
    # window raises the unit to 256 there; this mode runs no such window.)
    scheduler = config.scheduler.model_copy(update={"chunk_unit": cache.block_size})
    config = config.model_copy(update={"cache": cache, "model": model, "scheduler": scheduler})
    info = ExecutorInfo(
        num_kv_blocks=num_blocks,
        block_size=cache.block_size,
        max_model_len=max_model_len,
        owns_batching=True,
        mirrors_executor_kv=True,
    )
    return EngineCore.from_config(config, LoopExecutor(info), clock, predictor)


def our_priority(llm_priority: Any) -> int:
    """TensorRT-LLM's request priority (float in [0, 1], higher first, 0.5 default) as
    ours, the inverse of ``llm_api.translate.llm_priority``; 0 when it is not a float
    strictly inside (0, 1)."""
    if not isinstance(llm_priority, float) or not 0.0 < llm_priority < 1.0:
        return 0
    return round(math.tan((0.5 - llm_priority) * math.pi))


class CoreRequestScheduler:
    """A ``RequestScheduler`` (``schedule_request``, ``can_schedule``,
    ``scheduling_state_range``; the installer derives it from the installed release's
    ``RequestScheduler``, ``install.derived_scheduler``, so that base's concrete methods
    are its own) whose decisions are ``engine``'s (an ``in_loop_engine``),
    on ``engine.clock`` (the wall clock in the worker).
    ``facts`` (optional) supplies per-request facts (a request without them waits up
    to ``facts.facts_wait_s`` seconds on ``engine.clock``); ``refusals`` (optional)
    hears the requests the core refuses, by the facts' key; ``link`` (optional) shares rank 0's
    decision with the other tensor-parallel ranks (on a follower, ``engine`` is not
    used). With ``record``, ``history`` and ``plans`` keep each iteration's ``Decision``
    and the core's plan (the tests compare and print them).
    """

    def __init__(
        self,
        engine: EngineCore,
        types: TrtllmTypes,
        kv: KvSource | None,
        *,
        facts: FactsSource | None = None,
        refusals: RefusalSink | None = None,
        link: RankLink | None = None,
        record: bool = False,
    ) -> None:
        self.engine = engine
        self._types = types
        self._kv = kv
        self._facts = facts
        self._refusals = refusals
        self._link = link
        self._plan: SchedulerOutput | None = None
        self._plan_time = 0.0
        self._seen: set[int] = set()  # ids queued in the core and still active
        self._client_ids: dict[int, int] = {}  # their facts' keys (py_client_id)
        self._holds_kv: set[int] = set()  # ids TensorRT-LLM holds KV for
        self._num_tokens: dict[int, int] = {}  # get_num_tokens(0) when last planned
        self._planned: dict[int, Any] = {}  # the last plan's LlmRequests by id
        self.refused: dict[int, str] = {}  # refused ids still active, with why
        self.awaiting_facts: dict[int, float] = {}  # held ids: when first seen (clock s)
        self.num_without_facts = 0  # requests queued with no facts in the channel
        self.record = record
        self.history: list[Decision] = []
        self.plans: list[SchedulerOutput] = []

    @property
    def scheduler(self) -> Any:
        """The core's scheduler (read-only use: tests and logs)."""
        return self.engine.scheduler

    @property
    def last_plan(self) -> SchedulerOutput | None:
        """The core's plan of the latest iteration (``None`` before the first)."""
        return self._plan

    # ------------------------------------------------------------------ RequestScheduler

    @property
    def scheduling_state_range(self) -> tuple[Any, Any]:
        """The half-open state range admitted to a forward batch (1.3 line's abstract
        property): context start up to generation complete, as TensorRT-LLM's own
        capacity schedulers use (``no_schedule_until_state`` /
        ``no_schedule_after_state``)."""
        return (self._types.context_init, self._types.generation_complete)

    def can_schedule(self, requests: Sequence[Any]) -> bool:
        """Attention-DP balancing asks whether this rank could take ``requests``: yes
        while the core's KV pool has room for all their tokens (attention DP is not a
        checked configuration; this answers conservatively)."""
        kv = self.engine.scheduler.kv
        need = sum(kv.blocks_for(int(r.get_num_tokens(0))) for r in requests)
        return need <= kv.num_free_blocks

    def schedule_request(self, active_requests: Sequence[Any], inflight_request_ids: Any) -> Any:
        """One iteration's ``SchedulerOutput`` (the module docstring's four steps).
        ``inflight_request_ids`` is not read: with one pipeline stage and the overlap
        scheduler off (both required at installation) no request is in flight here. If
        deciding raises on rank 0, the other ranks are told (``RankLink.fail``) and raise
        ``RankError`` too, so no rank is left waiting for a schedule; the error ends
        TensorRT-LLM's loop on every rank, as any exception out of the scheduler does."""
        by_id = {int(r.py_request_id): r for r in active_requests}
        if self._link is not None and not self._link.is_leader:
            return self._output(self._link.share(None), by_id)
        try:
            now = self.engine.clock.now()
            self._apply_previous(by_id, now)
            self._queue_new(active_requests, now)
            plan = self.engine.plan_step(now)
            decision = self._decide(plan, by_id)
        except Exception as err:
            if self._link is not None:
                self._link.fail(f"{type(err).__name__}: {err}")
            raise
        self._plan, self._plan_time = plan, now
        if self._link is not None:
            decision = self._link.share(decision)
        if self.record:
            self.history.append(decision)
            self.plans.append(plan)
        if by_id and not (decision.context or decision.generation or decision.paused):
            self._idle_wait()
        return self._output(decision, by_id)

    def _idle_wait(self) -> None:
        """An iteration with nothing to run while requests are active (refused ones
        waiting for their abort, held ones waiting for their facts, or requests the core
        cannot place yet): block up to ``IDLE_WAIT_S`` seconds, ended early by arriving
        facts, instead of returning to a loop that would call again at once. Nothing
        is observed for the empty step (``EngineCore.finish_step`` feeds the predictor
        only plans that scheduled something)."""
        if self._facts is not None:
            self._facts.wait_for_facts(IDLE_WAIT_S)
        else:
            time.sleep(IDLE_WAIT_S)

    # ------------------------------------------------------------------ steps

    def _apply_previous(self, by_id: dict[int, Any], now: float) -> None:
        """Step 1: the previous iteration's outcome into the core. Tokens are read from
        the planned ``LlmRequest`` objects, which keep them after TensorRT-LLM ended a
        request; then requests still live in the core but gone from
        ``active_requests`` (cancelled, or stopped by TensorRT-LLM) are aborted."""
        plan = self._plan
        if plan is not None:
            sampled: dict[str, int] = {}
            failed: dict[str, str] = {}
            for s in plan.scheduled:
                if not s.sample:
                    continue
                rid = int(s.request_id)
                req = self._planned[rid]
                if int(req.get_num_tokens(0)) > self._num_tokens[rid]:
                    # get_last_tokens: one token; get_tokens copies the whole sequence.
                    sampled[s.request_id] = int(req.get_last_tokens(0))
                elif rid in by_id:
                    # Never expected (install refuses the overlap scheduler, under which
                    # tokens reach the host an iteration late): the core ends it.
                    failed[s.request_id] = "TensorRT-LLM showed no token for this step"
                    logger.error("request %d sampled no visible token", rid)
                # else: it ended without a token (cancelled); aborted below
            gone = {s.request_id for s in plan.scheduled if int(s.request_id) not in by_id}
            for rid_str in gone - sampled.keys():
                self.engine.abort(rid_str)  # cancelled during the iteration
            result = StepResult(sampled, now - self._plan_time, failed=failed)
            self._end_what_the_core_ended(
                self.engine.finish_step(plan, result, self._plan_time), by_id
            )
        for rid in [r for r in self._seen if r not in by_id]:
            self._seen.discard(rid)
            self._client_ids.pop(rid, None)
            self._holds_kv.discard(rid)
            self._num_tokens.pop(rid, None)
            self.engine.abort(str(rid))  # no-op for a request the core finished
        for rid in [r for r in self.refused if r not in by_id]:
            del self.refused[rid]  # aborted (or ended) in TensorRT-LLM: nothing held
        for rid in [r for r in self.awaiting_facts if r not in by_id]:
            del self.awaiting_facts[rid]  # cancelled while held: it never reached the core
        if self._kv is not None:
            # Read after the core freed what ended: TensorRT-LLM may free it later.
            self.engine.scheduler.kv.observe_executor_free(self._kv.free_blocks())

    def _queue_new(self, active_requests: Iterable[Any], now: float) -> None:
        """Step 2: requests the core has not seen join its waiting queue."""
        start, stop = self.scheduling_state_range
        for req in active_requests:
            rid = int(req.py_request_id)
            if rid in self._seen or rid in self.refused:
                continue
            if not start.value <= req.state.value < stop.value:
                continue
            client_id = int(getattr(req, "py_client_id", None) or rid)
            facts = None
            if self._facts is not None:
                facts = self._facts.take(client_id)
                if facts is None and self._hold_for_facts(rid, now):
                    continue  # not queued: never scheduled, holds no KV
            # A request without an arrival of its own arrived when the loop first saw it.
            seen_at = self.awaiting_facts.pop(rid, now)
            try:
                self.engine.add_request(self._submission(req, facts, seen_at))
            except (AdmissionError, OverloadedError) as err:
                why = f"the scheduler inside TensorRT-LLM's loop refused the request: {err}"
                self._refuse(rid, client_id, why)
                continue
            self._seen.add(rid)
            self._client_ids[rid] = client_id

    def _end_what_the_core_ended(self, step: EngineStep, by_id: dict[int, Any]) -> None:
        """Requests the core ended with an error of its own (shed past their TTFT
        deadline while waiting, or failed: no visible token) but TensorRT-LLM still
        holds: nothing in TensorRT-LLM ends them, so their clients would wait until the
        front's stall error; they are ended through the refusal path with the core's
        error, and never scheduled again (the core no longer has them)."""
        for out in step.outputs:
            rid = int(out.request_id)
            if out.finish_reason is FinishReason.ERROR and rid in by_id and rid not in self.refused:
                why = f"the scheduler inside TensorRT-LLM's loop ended the request: {out.error}"
                self._refuse(rid, self._client_ids.get(rid, rid), why)

    def _hold_for_facts(self, rid: int, now: float) -> bool:
        """Whether ``rid``, whose facts have not arrived, stays out of the schedule this
        iteration: until ``facts_wait_s`` has passed since it was first seen. Past that
        it is queued with the defaults (the release's priority, the default class)."""
        assert self._facts is not None
        wait_s = self._facts.facts_wait_s
        first = self.awaiting_facts.setdefault(rid, now)
        if now - first < wait_s:
            return True
        self.num_without_facts += 1
        if wait_s > 0:
            logger.warning(
                "in-executor scheduler: no facts for request %d after %.2f s; queued with "
                "the defaults",
                rid,
                now - first,
            )
        return False

    def _refuse(self, rid: int, client_id: int, reason: str) -> None:
        """End a request TensorRT-LLM holds and the core will not run (refused at
        admission, or ended by the core): the refusal sink's listener ends it with
        ``reason`` (its client gets that error) and aborts it in TensorRT-LLM, which then
        drops it. It is never scheduled again. A refused request never held KV; one the
        core ended after it ran keeps its KV in TensorRT-LLM until the abort is handled
        (the core's admission counts TensorRT-LLM's free blocks, so nothing is
        overcommitted meanwhile)."""
        self.refused[rid] = reason
        heard = self._refusals is not None and self._refusals.refuse(client_id, reason)
        if heard:
            logger.warning("in-executor scheduler: request %d: %s", rid, reason)
        else:
            # Submitted by other code than our backend: nobody to answer; it stays
            # unscheduled until its submitter aborts it.
            logger.error(
                "in-executor scheduler: request %d, and no submitter heard it: %s", rid, reason
            )

    def _submission(self, req: Any, facts: RequestFacts | None, seen_at: float) -> Submission:
        if facts is None:
            facts = RequestFacts(priority=our_priority(getattr(req, "priority", None)))
        return Submission(
            str(int(req.py_request_id)),
            tuple(int(t) for t in req.get_tokens(0)),
            # No stop ids: TensorRT-LLM's sampler ends requests on theirs.
            SamplingParams(max_tokens=int(req.max_new_tokens), temperature=0),
            priority=facts.priority,
            arrival_time=facts.arrival_time if facts.arrival_time is not None else seen_at,
            slo_class=facts.slo_class,
            tenant=facts.tenant,
        )

    def _decide(self, plan: SchedulerOutput, by_id: dict[int, Any]) -> Decision:
        """Step 4, by id: our plan checked against TensorRT-LLM's requests."""
        context: list[tuple[int, int]] = []
        generation: list[int] = []
        self._planned = {}
        for s in plan.scheduled:
            rid = int(s.request_id)
            req = by_id.get(rid)
            if req is None:
                raise AdapterError(f"the plan schedules request {rid}, which is not active")
            state = req.state
            if state.value > self._types.generation_in_progress.value:
                continue  # ended in TensorRT-LLM's sampler; it leaves active_requests next
            if state == self._types.context_init:
                position = int(req.context_current_position)
                if position != s.start_position:
                    raise AdapterError(
                        f"request {rid}: the plan starts its chunk at {s.start_position}, "
                        f"TensorRT-LLM's context position is {position}"
                    )
                context.append((rid, s.num_tokens))
            elif state == self._types.generation_in_progress and s.num_tokens == 1:
                generation.append(rid)
            else:
                raise AdapterError(
                    f"request {rid}: the plan gives it {s.num_tokens} tokens in state {state}"
                )
            self._holds_kv.add(rid)
            self._planned[rid] = req
            self._num_tokens[rid] = int(req.get_num_tokens(0))
        paused = [int(p) for p in plan.preempted_ids if int(p) in self._holds_kv]
        for rid in paused:
            self._holds_kv.discard(rid)
        return Decision(tuple(context), tuple(generation), tuple(paused))

    def _output(self, decision: Decision, by_id: dict[int, Any]) -> Any:
        """The release's ``SchedulerOutput`` for ``decision`` (fields filled by name)."""
        context = []
        for rid, chunk in decision.context:
            req = by_id[rid]
            req.context_chunk_size = chunk
            context.append(req)
        generation = [by_id[rid] for rid in decision.generation]
        paused = [by_id[rid] for rid in decision.paused if rid in by_id]
        values = {
            "encoder_requests": [],
            "context_requests": context,
            "generation_requests": generation,
            "paused_requests": paused,
            "fitting_disagg_gen_init_requests": [],
            "num_fitting_requests": len(context) + len(generation),
            "scheduled_mm_encoder_items": None,
        }
        output_type = self._types.output_type
        return output_type(**{name: values[name] for name in output_type._fields if name in values})
