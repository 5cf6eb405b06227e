"""Admission policies: whether a submission is queued, and when to come back if not.
Chosen by ``scheduler.admission.type`` (a key of ``ADMISSION_POLICIES``, which a unit
test checks against the config's ``AdmissionName``).

Both policies refuse beyond the waiting queue's request and token limits; ``slo`` also
predicts the request's TTFT and refuses (or downgrades) a request that would miss its
class's target, judging the prediction by its measured error. Every refusal is an
``OverloadedError`` whose ``retry_after_s`` comes from ``forecast.Forecast``, a drain
model of the scheduler's state, and is followed to learn whether it was needed
(``slo.TtftOutcomes``). A policy reads the scheduler through ``view.SchedulerView`` only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from orchestrator.core.config import SchedulerConfig
from orchestrator.core.errors import AdmissionError, OverloadedError, retry_after_header_s
from orchestrator.core.request import Request
from orchestrator.core.sched.forecast import Bookings, Forecast
from orchestrator.core.sched.slo import TtftOutcomes, assign_class
from orchestrator.core.sched.view import BlockCounts, SchedulerView


def check_fits(
    request: Request,
    kv: BlockCounts,
    max_model_len: int,
    config: SchedulerConfig,
    chunks_prefill: bool,
) -> None:
    """Raise ``AdmissionError`` if the request could never run to completion: its prompt
    plus ``max_tokens`` exceeds the context (tokens) or the KV pool (blocks), or, when
    the batching strategy does not chunk prefill, one step's budget."""
    n_prompt, max_tokens = request.num_prompt_tokens, request.sampling.max_tokens
    lifetime = n_prompt + max_tokens
    if lifetime > max_model_len:
        raise AdmissionError(
            f"prompt has {n_prompt} tokens and max_tokens is {max_tokens}: together "
            f"{lifetime}, over the model's maximum context of {max_model_len} tokens"
        )
    blocks = kv.blocks_for(lifetime)
    if blocks > kv.num_blocks:
        raise AdmissionError(
            f"prompt plus max_tokens ({lifetime} tokens) needs {blocks} KV blocks; "
            f"the KV pool holds {kv.num_blocks}"
        )
    if not chunks_prefill and lifetime > config.max_num_tokens:
        raise AdmissionError(
            f"without chunked prefill, prompt plus max_tokens ({lifetime} tokens) must "
            f"fit one step's budget (max_num_tokens={config.max_num_tokens})"
        )


class AdmissionPolicy(Protocol):
    """Decides at submission. ``admit`` either returns (the request may be queued; it may
    have changed the request's SLO class) or raises ``OverloadedError`` with nothing
    changed in the scheduler. ``outcomes`` follows its refusals (and, for ``slo``, its
    predictions) to their end: the regretted refusals the engine reports."""

    outcomes: TtftOutcomes

    def admit(self, scheduler: SchedulerView, request: Request, now: float) -> None: ...


class QueueLimitAdmission:
    """Refuse beyond ``max_waiting_requests`` or ``max_waiting_tokens`` (code
    ``queue_full`` / ``queue_tokens_full``), with ``Retry-After`` the predicted time for
    the queue to drain below the limit: the excess requests (or tokens) at the head of
    the queue must be admitted first."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.outcomes = TtftOutcomes(
            config.admission.error_quantile,
            learn_from_regret=config.admission.learn_from_regret,
        )

    def admit(self, scheduler: SchedulerView, request: Request, now: float) -> None:
        self.outcomes.update(scheduler.room, now)
        cfg = self.config
        waiting = scheduler.waiting
        count = len(waiting)
        if count >= cfg.max_waiting_requests:
            excess = count - cfg.max_waiting_requests + 1
            tokens = waiting.num_tokens * excess // max(count, 1)
            retry_after = self._retry_after(scheduler, now, tokens, excess)
            self._follow(scheduler, request, now)
            raise OverloadedError(
                f"server busy: {count} requests already waiting "
                f"(max_waiting_requests={cfg.max_waiting_requests})",
                retry_after,
                code="queue_full",
            )
        if waiting.num_tokens + request.num_prompt_tokens > cfg.max_waiting_tokens:
            excess_tokens = waiting.num_tokens + request.num_prompt_tokens - cfg.max_waiting_tokens
            per_request = waiting.num_tokens / max(count, 1)
            retry_after = self._retry_after(
                scheduler, now, excess_tokens, math.ceil(excess_tokens / max(per_request, 1.0))
            )
            self._follow(scheduler, request, now)
            raise OverloadedError(
                f"server busy: {waiting.num_tokens} prompt tokens already waiting "
                f"(max_waiting_tokens={cfg.max_waiting_tokens})",
                retry_after,
                code="queue_tokens_full",
            )

    def _retry_after(
        self, scheduler: SchedulerView, now: float, tokens: int, requests: int
    ) -> float:
        drain = Forecast(scheduler, now).drain_s(tokens, requests)
        return max(self.config.admission.min_retry_after_s, drain)

    def _follow(
        self,
        scheduler: SchedulerView,
        request: Request,
        now: float,
        forecast: Forecast | None = None,
        ahead: list[Request] | None = None,
    ) -> None:
        """Hand a refused request to ``outcomes``, with what would have had its first
        token before it: running requests without one, and the waiting requests ahead of
        it in policy order (``ahead`` when the caller has them)."""
        if request.ttft_target_s is None:
            return
        forecast = forecast or Forecast(scheduler, now)
        if ahead is None:
            ahead = list(scheduler.waiting.ahead_of(scheduler.ordering.admission_key(request)))
        own = request.num_uncomputed_tokens - request.num_expected_cached_tokens
        self.outcomes.refused(
            request,
            [r for r in scheduler.running if r.first_token_time is None] + ahead,
            forecast.prefill_s(own),
            now + forecast.in_flight_s,
        )


class SloAdmission(QueueLimitAdmission):
    """Queue limits, then a TTFT prediction against the request's TTFT target (its own,
    else its class's).

    The prediction is the time already waited plus ``Forecast.first_token_s`` behind the
    waiting requests that rank ahead of it in policy order, plus, for a constrained
    request, the expected compile time of its grammar (and, with
    ``reserve_retries``, the refused requests told to come back within its target). If
    the prediction times its class's measured error (``TtftOutcomes.correction``: an
    upper quantile of recent actual/predicted ratios, 1 while the class has few) exceeds
    ``ttft_margin`` x that target, the request is moved to
    ``downgrade_to`` when that class's target is met (not a request with a target of its
    own, which moving would not change), else refused with code
    ``ttft_unattainable`` and ``Retry-After`` = the predicted excess over the target
    plus the prefill time of the refused requests already told to return (each refused
    client takes the next place in that virtual queue, ``Bookings``). Prompt
    tokens the prefix cache holds now are not counted as work, for the request or for
    those ahead of it (``num_expected_cached_tokens``). A request without a TTFT target
    (no class, none of its own) is only subject to the queue limits. The prediction is
    stored on the request (``predicted_ttft_s``) so the engine can track its error.

    Two safeguards against a wrong step-time fit: while the predictor is not
    ``trusted`` (no fit measured here yet, or its recent error over its bound) only the
    queue limits apply, and no TTFT is predicted; and a request at an idle server (no
    step in flight, nothing running, nothing waiting or booked ahead of it) whose prompt
    fits one step is always admitted: nothing could serve it sooner, so a refusal would
    help no one.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.bookings = Bookings()

    def admit(self, scheduler: SchedulerView, request: Request, now: float) -> None:
        super().admit(scheduler, request, now)
        cfg = self.config
        target_s = request.ttft_target_s
        if target_s is None or not scheduler.predictor.trusted:
            return
        forecast = Forecast(scheduler, now)
        cached = scheduler.kv.probe_cached_tokens(request)
        own = request.num_uncomputed_tokens - cached
        key = scheduler.ordering.admission_key(request)
        ahead_requests = list(scheduler.waiting.ahead_of(key))
        ahead = [r.num_expected_prefill_tokens for r in ahead_requests]
        correction = self.outcomes.correction(request.slo_class)
        # The largest prediction admitted: the target over the ratio by which recent
        # TTFTs of the class ran past (or short of) their predictions.
        budget_s = cfg.admission.ttft_margin * target_s / correction
        reserve = cfg.admission.reserve_retries
        prompt_key = hash(tuple(request.prompt_token_ids)) if reserve else 0
        if reserve and len(self.bookings):
            # A returning request waits only behind bookings due before its own.
            own_due = self.bookings.settle(now, prompt_key)
            until = now + budget_s if own_due is None else own_due
            ahead += self.bookings.expected_ahead(until)
        waited = now - request.arrival_time
        # A constrained request first waits for its grammar, whatever runs meanwhile.
        compile_s = scheduler.constraints.expected_s(request)
        predicted = waited + compile_s + forecast.first_token_s(ahead, own, request.priority)
        # Kept by an admitted request only; a refused one is dropped whole.
        request.predicted_ttft_s = predicted
        request.num_expected_cached_tokens = cached
        if (
            predicted <= budget_s
            or self._idle_and_fits(scheduler, forecast, ahead, own)
            or self._downgrade(scheduler, request, predicted)
        ):
            self.outcomes.admitted(request)
            return
        booked = round(self.bookings.expected_tokens()) if reserve else 0
        drain = predicted - budget_s + forecast.prefill_s(booked)
        retry_after = max(cfg.admission.min_retry_after_s, drain)
        if reserve:
            # The client is told whole seconds: it comes back at the end of them.
            self.bookings.book(now + retry_after_header_s(retry_after), own, prompt_key)
        self._follow(scheduler, request, now, forecast, ahead_requests)
        raise OverloadedError(
            self._refusal(request, predicted, correction, target_s),
            retry_after,
            code="ttft_unattainable",
        )

    def _refusal(
        self, request: Request, predicted: float, correction: float, target_s: float
    ) -> str:
        """Why ``request`` was refused: its predicted TTFT (s), corrected by the measured
        error, against its target (s) and whose target that is."""
        whose = (
            "set by the request"
            if request.own_ttft_s is not None
            else f"of SLO class {request.slo_class!r}"
        )
        corrected = (
            f" (x{correction:.2f}, the measured TTFT / prediction lately: "
            f"{predicted * correction * 1e3:,.0f} ms)"
            if correction != 1
            else ""
        )
        margin = self.config.admission.ttft_margin
        return (
            f"server busy: predicted time to first token {predicted * 1e3:,.0f} ms"
            f"{corrected} exceeds the {target_s * 1e3:g} ms target {whose}"
            + (f" (x{margin:g} margin)" if margin != 1 else "")
        )

    @staticmethod
    def _idle_and_fits(
        scheduler: SchedulerView, forecast: Forecast, ahead: list[int], own: int
    ) -> bool:
        """Whether nothing runs, is in flight, waits or is booked ahead, and ``own``
        prompt tokens fit one step: then this request's first token cannot come sooner
        on any schedule."""
        return (
            not scheduler.running
            and not ahead
            and forecast.in_flight_s == 0.0
            and own <= forecast.prefill_per_step
        )

    def _downgrade(self, scheduler: SchedulerView, request: Request, predicted: float) -> bool:
        """Move ``request`` to the best-effort class if its target admits ``predicted``
        (a lower class ranks later, so the prediction only holds as an estimate)."""
        name = self.config.admission.downgrade_to
        # A request's own TTFT target stays its target in any class, so moving it cannot help.
        if name is None or name == request.slo_class or request.own_ttft_s is not None:
            return False
        target = self.config.slo_classes[name]
        limit = self.config.admission.ttft_margin * target.ttft_s / self.outcomes.correction(name)
        if predicted > limit:
            return False
        assign_class(request, name, self.config.slo_classes)
        return True


ADMISSION_POLICIES: dict[str, Callable[[SchedulerConfig], AdmissionPolicy]] = {
    "queue_limits": QueueLimitAdmission,
    "slo": SloAdmission,
}
