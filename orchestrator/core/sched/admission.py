"""Admission policies: whether a submission is queued, and when to come back if not.
Chosen by ``scheduler.admission.type`` (a key of ``ADMISSION_POLICIES``).

Both policies refuse beyond the waiting queue's request and token limits; ``slo`` also
predicts the request's TTFT and refuses (or downgrades) a request that would miss its
class's target. Every refusal is an ``OverloadedError`` whose ``retry_after_s`` comes
from ``Forecast``, a drain model of the scheduler's current state:

- each step runs the running requests' decode tokens and ``P = budget - D`` prefill
  tokens (``D`` running requests; ``budget`` is ``max_num_tokens``, or the SLO-derived
  budget when that is on), and takes the step-time predictor's time ``T`` for that
  shape;
- a request's first token comes once the prefill ahead of it (running requests'
  unfinished prompts, the waiting requests ahead of it in policy order, then its own
  prompt, at most ``chunk_size`` per step for itself) has run, and, when the batch is
  full, once enough running requests have finished (their remaining ``max_tokens``,
  one per step) to free its slot;
- a request submitted while a step is in flight (the simulator's arrivals; the gateway
  submits between steps) first waits for that step to end.

The model is deliberately simple (no KV pressure, outputs assumed to run to
``max_tokens``, which overestimates waits on early stops); the engine tracks its
error against the TTFTs that follow (``EngineStats.ttft_prediction_error``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from orchestrator.core.errors import OverloadedError
from orchestrator.core.predictor import StepFeatures, mixed_step
from orchestrator.core.request import Request

if TYPE_CHECKING:
    from orchestrator.core.config import SchedulerConfig
    from orchestrator.core.sched.scheduler import Scheduler


# A replay longer than this many steps predicts far past any TTFT target anyway.
_MAX_REPLAY_STEPS = 20_000
# How long past its due time a refused request's booking is kept (s): Retry-After is in
# whole seconds, rounded up, and a client takes a moment to send again.
RETURN_GRACE_S = 2.0
# Weight of each settled booking (came back, or lapsed) in the learned return rate.
RETURN_RATE_WEIGHT = 0.1


class Forecast:
    """The scheduler's drain rate at ``now`` (s, the engine's clock): ``prefill_per_step``
    prefill tokens per step beside the current decode load, each step timed by the
    step-time predictor for the prefill it actually carries, after ``in_flight_s`` for
    a step still running."""

    def __init__(self, scheduler: Scheduler, now: float) -> None:
        cfg = scheduler.config
        running = scheduler.running
        self.num_running = len(running)
        self.decode_context = 0
        self._running_prefill_list: list[int] = []
        for r in running:
            uncomputed = r.num_uncomputed_tokens
            if uncomputed > 1:
                self._running_prefill_list.append(uncomputed)
            else:
                self.decode_context += r.num_computed_tokens
        self.running_prefill = sum(self._running_prefill_list)
        budget = scheduler.step_budget()
        self.prefill_per_step = max(budget - self.num_running, 1)
        self.chunk_size = cfg.chunk_size
        self.chunk = min(cfg.chunk_size, self.prefill_per_step)
        self.max_batch_size = cfg.max_batch_size
        self._predict = scheduler.predictor.predict
        self._running = running
        self._remaining: list[int] | None = None
        self.in_flight_s = max(0.0, scheduler.step_end_time - now)
        self.arrival_tokens_per_s = scheduler.admitted_tokens_per_s()

    def step_s(self, prefill_tokens: int) -> float:
        """Predicted seconds of a step with the current decodes and ``prefill_tokens``."""
        chunks = math.ceil(prefill_tokens / self.chunk_size)
        return self._predict(
            mixed_step(self.num_running, self.decode_context, prefill_tokens, chunks)
        )

    def prefill_s(self, tokens: int) -> float:
        """Seconds to run ``tokens`` of prefill: full steps, then the remainder."""
        full, rest = divmod(tokens, self.prefill_per_step)
        t = full * self.step_s(self.prefill_per_step) if full else 0.0
        return t + (self.step_s(rest) if rest else 0.0)

    def _slot_wait_steps(self, needed: int) -> float:
        """Steps until ``needed`` running requests have finished (one token per step each,
        up to their ``max_tokens``); beyond the running batch, each further batch takes
        as long as the mean running request."""
        if self._remaining is None:
            self._remaining = sorted(
                max(r.sampling.max_tokens - r.num_output_tokens, 1) for r in self._running
            )
        remaining = self._remaining
        if not remaining:
            return 0.0
        if needed <= len(remaining):
            return float(remaining[needed - 1])
        mean = sum(remaining) / len(remaining)
        rounds = math.ceil((needed - len(remaining)) / len(remaining))
        return remaining[-1] + rounds * mean

    def drain_s(self, tokens: int, requests: int) -> float:
        """Coarse seconds until ``tokens`` of waiting prefill in ``requests`` requests have
        been admitted (full budgets per step, and the batch cap); O(1) apart from one sort,
        for the queue-limit Retry-After where the queue may be long."""
        t = self.in_flight_s + self.prefill_s(self.running_prefill + tokens)
        short = requests - (self.max_batch_size - self.num_running)
        if short > 0:
            t = max(t, self._slot_wait_steps(short) * self.step_s(0))
        return t

    def first_token_s(self, ahead: Sequence[int], own_tokens: int) -> float:
        """Seconds from now until the first token of a request with ``own_tokens`` to
        prefill, queued behind waiting requests with ``ahead`` tokens each (policy order).

        A step-by-step replay of the continuous strategy: running requests' unfinished
        prompts first, then waiting requests in order, each getting at most
        ``chunk_size`` tokens of the step's prefill budget; a waiting request enters only
        once the batch has a free slot (running requests finish after their remaining
        ``max_tokens``); a request whose prompt is done joins the decodes; the budget a
        step leaves is taken by later arrivals at the recent rate of admitted prompt
        tokens. Each step is timed by the predictor for the tokens it carries.
        O(steps x requests per step).
        """
        waiting = [*ahead, own_tokens]
        own_index = len(waiting) - 1
        free = self.max_batch_size - self.num_running
        # Active prompts: [remaining tokens, prompt tokens, waiting index or -1].
        active: list[list[int]] = [[n, n, -1] for n in self._running_prefill_list]
        decodes, context = self.num_running - len(active), self.decode_context
        budget, chunk = self.prefill_per_step, self.chunk_size
        last_s = self.step_s(0)
        t = self.in_flight_s
        step, nxt = 0, 0
        for _ in range(_MAX_REPLAY_STEPS):
            # This step's prefill: tokens, chunks, cached positions read, attention pairs.
            left, tokens, chunks, cached, pairs = budget, 0, 0, 0, 0
            for entry in active:
                if left == 0:
                    break
                n = min(entry[0], chunk, left)
                position = entry[1] - entry[0]
                entry[0] -= n
                left, tokens, chunks = left - n, tokens + n, chunks + 1
                cached, pairs = cached + position, pairs + n * position + n * (n + 1) // 2
            while left > 0 and nxt < len(waiting) and self._slot_ready(nxt, free) <= step:
                n = min(waiting[nxt], chunk, left)
                active.append([waiting[nxt] - n, waiting[nxt], nxt])
                left, tokens, chunks = left - n, tokens + n, chunks + 1
                pairs += n * (n + 1) // 2
                nxt += 1
            if left > 0 and tokens and self.arrival_tokens_per_s > 0:
                # Later arrivals take the budget this step leaves: at the recent rate of
                # admitted prompt tokens, over the previous step's time.
                extra = min(left, int(self.arrival_tokens_per_s * last_s))
                if extra:
                    k = math.ceil(extra / chunk)
                    per = extra // k
                    tokens, chunks, pairs = tokens + extra, chunks + k, pairs + k * per * per // 2
            if tokens == 0:
                # Nothing can run until a slot frees: decode-only steps until then.
                ready = math.ceil(self._slot_ready(nxt, free)) if nxt < len(waiting) else step + 1
                t += max(ready - step, 1) * self.step_s(0)
                step = max(ready, step + 1)
                continue
            last_s = self._predict(
                StepFeatures(
                    decodes + tokens,
                    decodes + chunks,
                    decodes + chunks,
                    context + cached,
                    context + decodes + pairs,
                )
            )
            t += last_s
            step += 1
            done = [e for e in active if e[0] == 0]
            if done:
                active = [e for e in active if e[0] > 0]
                for e in done:
                    if e[2] == own_index:
                        return t
                    decodes, context = decodes + 1, context + e[1]
        return t

    def _slot_ready(self, index: int, free: int) -> float:
        """The step from which waiting request ``index`` (0-based, in order) has a slot."""
        return 0.0 if index < free else self._slot_wait_steps(index - free + 1)


class AdmissionPolicy(Protocol):
    """Decides at submission. ``admit`` either returns (the request may be queued; it may
    have changed the request's SLO class) or raises ``OverloadedError`` with nothing
    changed in the scheduler."""

    def admit(self, scheduler: Scheduler, request: Request, now: float) -> None: ...


class QueueLimitAdmission:
    """Refuse beyond ``max_waiting_requests`` or ``max_waiting_tokens`` (code
    ``queue_full`` / ``queue_tokens_full``), with ``Retry-After`` the predicted time for
    the queue to drain below the limit: the excess requests (or tokens) at the head of
    the queue must be admitted first."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    def admit(self, scheduler: Scheduler, request: Request, now: float) -> None:
        cfg = self.config
        waiting = scheduler.waiting
        count = len(waiting)
        if count >= cfg.max_waiting_requests:
            excess = count - cfg.max_waiting_requests + 1
            tokens = waiting.num_tokens * excess // max(count, 1)
            raise OverloadedError(
                f"server busy: {count} requests already waiting "
                f"(max_waiting_requests={cfg.max_waiting_requests})",
                self._retry_after(scheduler, now, tokens, excess),
                code="queue_full",
            )
        if waiting.num_tokens + request.num_prompt_tokens > cfg.max_waiting_tokens:
            excess_tokens = waiting.num_tokens + request.num_prompt_tokens - cfg.max_waiting_tokens
            per_request = waiting.num_tokens / max(count, 1)
            raise OverloadedError(
                f"server busy: {waiting.num_tokens} prompt tokens already waiting "
                f"(max_waiting_tokens={cfg.max_waiting_tokens})",
                self._retry_after(
                    scheduler, now, excess_tokens, math.ceil(excess_tokens / max(per_request, 1.0))
                ),
                code="queue_tokens_full",
            )

    def _retry_after(self, scheduler: Scheduler, now: float, tokens: int, requests: int) -> float:
        drain = Forecast(scheduler, now).drain_s(tokens, requests)
        return max(self.config.admission.min_retry_after_s, drain)


class Bookings:
    """Refused requests told to come back, each with its due time (s, engine clock),
    prompt tokens and prompt key (a hash of its prompt tokens, how its return is
    recognised).

    Not every client returns, so each booking counts as expected work with the learned
    ``return_rate``: the share of recent bookings whose prompt came back before they
    lapsed (``RETURN_GRACE_S`` past due), an exponential average starting at 1 (clients
    are trusted to honour Retry-After until they are seen not to). A client that never
    retries thus stops holding capacity others could use.
    """

    def __init__(self) -> None:
        self._due: list[tuple[float, int, int]] = []  # (due, tokens, key), by due
        self.return_rate = 1.0

    def __len__(self) -> int:
        return len(self._due)

    def _settle(self, returned: bool) -> None:
        self.return_rate += RETURN_RATE_WEIGHT * (float(returned) - self.return_rate)

    def settle(self, now: float, key: int) -> float | None:
        """Drop lapsed bookings and, when ``key`` is booked, that booking (its client is
        back); returns the returning booking's due time, else ``None``."""
        kept: list[tuple[float, int, int]] = []
        mine: float | None = None
        for booking in self._due:
            if mine is None and booking[2] == key:
                mine = booking[0]
                self._settle(True)
            elif booking[0] + RETURN_GRACE_S <= now:
                self._settle(False)
            else:
                kept.append(booking)
        self._due = kept
        return mine

    def expected_ahead(self, until: float) -> list[int]:
        """Prompt tokens of the bookings due by ``until`` that are expected back: the
        earliest ``return_rate`` share of them."""
        due = [tokens for t, tokens, _ in self._due if t <= until]
        return due[: round(self.return_rate * len(due))]

    def expected_tokens(self) -> float:
        """Prompt tokens of every booking, weighted by the return rate."""
        return self.return_rate * sum(tokens for _, tokens, _ in self._due)

    def book(self, due: float, tokens: int, key: int) -> None:
        bisect.insort(self._due, (due, tokens, key), key=lambda b: b[0])


class SloAdmission(QueueLimitAdmission):
    """Queue limits, then a TTFT prediction against the request's class target.

    The prediction is the time already waited plus ``Forecast.first_token_s`` behind the
    waiting requests that rank ahead of it in policy order (and, with
    ``reserve_retries``, the refused requests told to come back within its target). If
    it exceeds ``ttft_margin`` x the class's TTFT target, the request is moved to
    ``downgrade_to`` when that class's target is met, else refused with code
    ``ttft_unattainable`` and ``Retry-After`` = the predicted excess over the target
    plus the prefill time of the refused requests already told to return (each refused
    client takes the next place in that virtual queue, ``Bookings``). Prompt
    tokens the prefix cache holds now are not counted as work, for the request or for
    those ahead of it (``num_expected_cached_tokens``). A request without an SLO class
    is only subject to the queue limits. The prediction is stored on the request
    (``predicted_ttft_s``) so the engine can track its error.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.bookings = Bookings()

    def admit(self, scheduler: Scheduler, request: Request, now: float) -> None:
        super().admit(scheduler, request, now)
        cfg = self.config
        if request.slo_class is None:
            return
        target = cfg.slo_classes[request.slo_class]
        forecast = Forecast(scheduler, now)
        cached = scheduler.kv.probe_cached_tokens(request)
        own = request.num_uncomputed_tokens - cached
        key = scheduler.ordering.admission_key(request)
        ahead = [r.num_expected_prefill_tokens for r in scheduler.waiting.ahead_of(key)]
        budget_s = cfg.admission.ttft_margin * target.ttft_s
        reserve = cfg.admission.reserve_retries
        prompt_key = hash(tuple(request.prompt_token_ids)) if reserve else 0
        if reserve and len(self.bookings):
            # A returning request waits only behind bookings due before its own.
            own_due = self.bookings.settle(now, prompt_key)
            until = now + budget_s if own_due is None else own_due
            ahead += self.bookings.expected_ahead(until)
        waited = now - request.arrival_time
        predicted = waited + forecast.first_token_s(ahead, own)
        # Kept by an admitted request only; a refused one is dropped whole.
        request.predicted_ttft_s = predicted
        request.num_expected_cached_tokens = cached
        if predicted <= budget_s:
            return
        if self._downgrade(scheduler, request, predicted):
            return
        booked = round(self.bookings.expected_tokens()) if reserve else 0
        drain = predicted - budget_s + forecast.prefill_s(booked)
        retry_after = max(cfg.admission.min_retry_after_s, drain)
        if reserve:
            self.bookings.book(now + retry_after, own, prompt_key)
        raise OverloadedError(
            f"server busy: predicted time to first token {predicted * 1e3:,.0f} ms exceeds "
            f"the {target.ttft_ms:g} ms target of SLO class {request.slo_class!r}"
            + (
                f" (x{cfg.admission.ttft_margin:g} margin)"
                if cfg.admission.ttft_margin != 1
                else ""
            ),
            retry_after,
            code="ttft_unattainable",
        )

    def _downgrade(self, scheduler: Scheduler, request: Request, predicted: float) -> bool:
        """Move ``request`` to the best-effort class if its target admits ``predicted``
        (a lower class ranks later, so the prediction only holds as an estimate)."""
        name = self.config.admission.downgrade_to
        if name is None or name == request.slo_class:
            return False
        target = self.config.slo_classes[name]
        if predicted > self.config.admission.ttft_margin * target.ttft_s:
            return False
        scheduler.assign_class(request, name)
        return True


ADMISSION_POLICIES: dict[str, Callable[[SchedulerConfig], AdmissionPolicy]] = {
    "queue_limits": QueueLimitAdmission,
    "slo": SloAdmission,
}
