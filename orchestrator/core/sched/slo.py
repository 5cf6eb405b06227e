"""SLO bookkeeping beside the scheduler: classes, deadlines, shedding, TTFT prediction
errors, refusals, the outcomes of admission's TTFT forecasts (the error it is judged
by, and refusals that proved needless), and the SLO-derived token budget.

``SloTracker`` owns this state, but for ``TtftOutcomes``, which the admission policy
owns (it reads the requests' own first-token and finish times, so it needs no hook);
the scheduler calls the tracker through named hooks (on submit, on refusal, on queueing,
on a first token, at the start of a step) and never reaches into it, and the engine reads
the figures each keeps through a method (``SloTracker.figures``,
``TtftOutcomes.regretted_refusals``). Every hook is cheap when no SLO class is
configured: a request without a class has no deadline to shed and no prediction to
check.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from orchestrator.core.config import SchedulerConfig, SLOClassConfig
from orchestrator.core.errors import AdmissionError
from orchestrator.core.predictor import ErrorWindow, StepTimePredictor, mixed_step
from orchestrator.core.request import Request, RequestStatus
from orchestrator.core.sched.room import RoomView

# How many recent submissions the admitted-prompt-token rate is taken over.
RECENT_ADMITS = 64
# Output lengths kept per SLO class (finished requests), and how many a class needs
# before its lengths cap a request's expected output.
OUTPUT_LENGTH_WINDOW = 256
MIN_OUTPUT_LENGTHS = 8
# The share of a class's observed output lengths its cap covers: high, so the forecast
# errs on the long (safe) side for a class whose lengths vary.
OUTPUT_LENGTH_QUANTILE = 0.9
# TTFT outcomes kept per SLO class (actual / predicted ratios), and the weight, in
# outcomes, of the bare prediction (a ratio of 1) beside them: a class's first few
# outcomes move its correction only part of the way.
OUTCOME_WINDOW = 128
PRIOR_OUTCOMES = 8
# The shortest prediction, as a share of its request's TTFT target, whose outcome
# counts: admission decides near the target, and a short wait's ratio is mostly the
# phase of the step in flight (on a CPU, 14 ms predicted against 33 ms measured at a
# burst's first request lifted the correction to 1.46 before any long wait was seen).
RELEVANT_PREDICTION_SHARE = 0.25
# The lowest correction the outcomes may apply: a forecast that ran high in a calm
# spell admits at most twice its prediction's worth of work when a burst begins.
MIN_CORRECTION = 0.5
# Refusals whose outcome is still open; past this many the oldest is forgotten uncounted.
MAX_OPEN_REFUSALS = 1024


# Finished statuses whose output length is the request's own (not cut short by us).
_NATURAL_ENDS = frozenset((RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH))


class ArrivalRate(NamedTuple):
    """A recent rate of queued requests: prompt tokens and requests per second."""

    tokens_per_s: float
    requests_per_s: float


def assign_class(request: Request, name: str | None, classes: Mapping[str, SLOClassConfig]) -> None:
    """Give ``request`` SLO class ``name`` (a key of ``classes``, or ``None``) and its
    targets (s): each of its own (``own_ttft_s``, ``own_tpot_s``) where it has one, else
    the class's (none without a class); its TTFT deadline is its arrival plus its TTFT
    target (its arrival without one). Only for a request that is not queued yet: the
    deadline is part of its sort key."""
    request.slo_class = name
    target = classes[name] if name is not None else None
    ttft, tpot = request.own_ttft_s, request.own_tpot_s
    if target is not None:
        ttft = target.ttft_s if ttft is None else ttft
        tpot = target.tpot_s if tpot is None else tpot
    request.ttft_target_s, request.tpot_target_s = ttft, tpot
    request.ttft_deadline = request.arrival_time + (ttft or 0.0)


class OutputLengths:
    """What each SLO class's requests usually produce: the output lengths of the last
    ``window`` requests of the class that finished on their own, and from them a
    request's expected output length.

    A request that stopped (a stop token) shows how long the class's outputs run; one
    that reached its ``max_tokens`` (or the context) was cut off by its limit and would
    have run longer, so it counts as longer than any stopped one. ``cap(slo_class)`` is
    the ``quantile`` of these lengths (tokens) once the class has ``min_count``
    observations, and no cap while the quantile falls on cut-off requests (a class
    whose outputs run to their limits: then ``max_tokens`` is the best predictor).
    ``expected(request)`` is the request's ``max_tokens`` capped by that; before any
    cap, and for a request that has already produced more than the cap (it is in the
    tail, where the class's usual lengths say nothing), its ``max_tokens``. Requests
    without a class form one group of their own (``None``). A cap is re-sorted only
    when its class has had a new observation since it was last read.
    """

    def __init__(
        self,
        window: int = OUTPUT_LENGTH_WINDOW,
        min_count: int = MIN_OUTPUT_LENGTHS,
        quantile: float = OUTPUT_LENGTH_QUANTILE,
    ) -> None:
        self._window, self._min_count, self._quantile = window, min_count, quantile
        self._lengths: dict[str | None, deque[float]] = {}  # inf: cut off at its limit
        self._caps: dict[str | None, int | None] = {}  # absent: stale

    def observe(self, slo_class: str | None, num_output_tokens: int, stopped: bool) -> None:
        """A request of ``slo_class`` finished with ``num_output_tokens``: on a stop token
        (``stopped``), or at its length limit."""
        lengths = self._lengths.get(slo_class)
        if lengths is None:
            lengths = self._lengths[slo_class] = deque(maxlen=self._window)
        lengths.append(float(num_output_tokens) if stopped else math.inf)
        self._caps.pop(slo_class, None)

    def cap(self, slo_class: str | None) -> int | None:
        """The class's ``quantile`` of output lengths (tokens), or ``None`` with fewer
        than ``min_count`` observations or when that quantile is a cut-off request."""
        if slo_class in self._caps:
            return self._caps[slo_class]
        lengths = self._lengths.get(slo_class, ())
        cap = None
        if len(lengths) >= self._min_count:
            ordered = sorted(lengths)
            q = ordered[min(len(ordered) - 1, int(self._quantile * len(ordered)))]
            cap = None if math.isinf(q) else int(q)
        self._caps[slo_class] = cap
        return cap

    def expected(self, request: Request) -> int:
        max_tokens = request.sampling.max_tokens
        cap = self.cap(request.slo_class)
        if cap is None or request.num_output_tokens >= cap:
            return max_tokens
        return min(max_tokens, cap)


def _left_at(request: Request) -> float | None:
    """When ``request`` stopped waiting for its first token (s): that token's time, or
    when it left without one (shed, aborted, failed); ``None`` while it still waits."""
    if request.first_token_time is not None:
        return request.first_token_time
    return request.finish_time if request.is_finished else None


@dataclass(slots=True)
class _Refusal:
    """A refused request whose outcome is still open: when its first token would have
    come is known once every request in ``ahead`` has stopped waiting for theirs, and
    whether the scheduler had room for it once a step from ``earliest`` to its last
    useful start (``deadline - own_s``) had room, or none could any more."""

    slo_class: str | None
    arrival: float
    deadline: float
    own_s: float
    earliest: float  # when a step could first have started for it
    predicted: float | None  # admission's TTFT prediction for it (s), if it made one
    drained: float  # the latest time one of those ahead stopped waiting, so far
    ahead: list[Request]


class TtftOutcomes:
    """What became of admission's TTFT forecasts, per SLO class: the error that sizes
    SLO admission's margin, and the refusals that turned out needless.

    Ratios: for an admitted request with a prediction of at least
    ``RELEVANT_PREDICTION_SHARE`` of its TTFT target, ``actual / predicted`` TTFT once
    its first token comes (one that left without a token after its deadline counts
    with the time it left: a lower bound of a miss). ``correction(slo_class)`` is the
    ``quantile`` ``q`` of the class's last ``window`` ratios (``n`` of them) weighed
    against the bare prediction's 1 worth ``prior`` outcomes, ``(prior + n q) / (prior +
    n)``, and at least ``MIN_CORRECTION``: admission compares ``predicted x correction`` with the
    target, so a forecast that runs low adds its measured spread, one that runs high
    gives some back, and a class with no outcomes is judged on the bare prediction
    (refusing less while unsure; deadline shedding and EDF catch the misses).

    Regret: a refused request with a TTFT target is followed until every request that
    was ahead of it (running without a first token, or waiting ahead of it in policy
    order) has its first token or has left; its estimated TTFT is that moment (at the
    earliest, the refusal plus the step in flight) plus ``own_s``, the predicted
    prefill of its own prompt. The refusal is *regretted* when that is within its
    deadline **and** the scheduler had room for another prompt (``room.RoomLog``) in a
    step early enough for its own prefill to end by the deadline: capacity that went
    unused while the request it turned away could still have met its target.
    ``regretted[slo_class]`` counts them, ``resolved[slo_class]`` all refusals followed
    to their end. Judging the queue's drain alone counted most refusals under sustained
    overload as regretted, though the capacity they would have taken went to others;
    the room condition holds only where it did not.

    Learning from regret: a regretted refusal that admission made on a prediction adds
    its estimated ``actual / predicted`` ratio to its class's window, as an admitted
    request's outcome does. That ratio is below the correction that refused it, so
    refusals followed by idle capacity lower the class's correction, and the next
    requests like it are admitted.

    State is read lazily from the requests' own times (``first_token_time``,
    ``finish_time``) and the room log: ``update(room, now)`` harvests what has happened
    since the last call and is cheap to call every submission and every stats snapshot.
    """

    def __init__(
        self,
        quantile: float,
        window: int = OUTCOME_WINDOW,
        prior: float = PRIOR_OUTCOMES,
        learn_from_regret: bool = True,
    ) -> None:
        self._quantile, self._window, self._prior = quantile, window, prior
        self._learn_from_regret = learn_from_regret
        self._ratios: dict[str | None, deque[float]] = {}
        self._corrections: dict[str | None, float] = {}  # absent: stale
        # Admitted requests awaiting their first token, per class in submission order
        # (within a class, deadline order is mostly submission order).
        self._admitted: dict[str | None, deque[Request]] = {}
        self._refusals: deque[_Refusal] = deque()
        self.regretted: dict[str | None, int] = {}
        self.resolved: dict[str | None, int] = {}

    def admitted(self, request: Request) -> None:
        """``request`` was admitted with a prediction (``predicted_ttft_s``)."""
        self._admitted.setdefault(request.slo_class, deque()).append(request)

    def refused(
        self, request: Request, ahead: Iterable[Request], own_s: float, earliest: float
    ) -> None:
        """``request`` was refused; ``ahead``: the requests that would have had their
        first token before it; ``own_s``: its own predicted prefill (s); ``earliest``:
        when a step could first start for it (s, the engine's clock). Its
        ``predicted_ttft_s``, when admission set one, is the prediction it was refused
        on. Without a TTFT target it cannot be regretted, and is not followed."""
        target = request.ttft_target_s
        if target is None:
            return
        if len(self._refusals) >= MAX_OPEN_REFUSALS:
            self._refusals.popleft()
        waiting = [r for r in ahead if _left_at(r) is None]
        self._refusals.append(
            _Refusal(
                slo_class=request.slo_class,
                arrival=request.arrival_time,
                deadline=request.arrival_time + target,
                own_s=own_s,
                earliest=earliest,
                predicted=request.predicted_ttft_s,
                drained=earliest,
                ahead=waiting,
            )
        )

    def correction(self, slo_class: str | None) -> float:
        """The factor admission applies to a prediction for ``slo_class`` (see above)."""
        cached = self._corrections.get(slo_class)
        if cached is not None:
            return cached
        ratios = self._ratios.get(slo_class, ())
        factor = 1.0
        if ratios:
            n, ordered = len(ratios), sorted(ratios)
            q = ordered[min(n - 1, int(self._quantile * n))]
            factor = max(MIN_CORRECTION, (self._prior + n * q) / (self._prior + n))
        self._corrections[slo_class] = factor
        return factor

    def update(self, room: RoomView, now: float) -> None:
        """Harvest first tokens, departures and steps with room (``room``) up to ``now``
        (s, the engine's clock) since the last call."""
        for slo_class, pending in self._admitted.items():
            while pending:
                request = pending[0]
                left = _left_at(request)
                if left is None:
                    break
                pending.popleft()
                predicted = request.predicted_ttft_s
                # Admission predicts only for requests with a TTFT target.
                target = request.ttft_target_s or 0.0
                if (
                    predicted
                    and predicted >= RELEVANT_PREDICTION_SHARE * target
                    and (request.first_token_time is not None or left > request.ttft_deadline)
                ):
                    self._observe(slo_class, (left - request.arrival_time) / predicted)
        if self._refusals:
            self._refusals = deque(r for r in self._refusals if not self._settle(r, room, now))

    def regretted_refusals(self, room: RoomView, now: float) -> tuple[tuple[str, int], ...]:
        """``(slo_class, count)`` of the regretted refusals so far, by class (``""`` for
        requests without one), after harvesting what has happened up to ``now``."""
        self.update(room, now)
        return tuple(sorted((name or "", n) for name, n in self.regretted.items()))

    def _observe(self, slo_class: str | None, ratio: float) -> None:
        ratios = self._ratios.get(slo_class)
        if ratios is None:
            ratios = self._ratios[slo_class] = deque(maxlen=self._window)
        ratios.append(ratio)
        self._corrections.pop(slo_class, None)

    def _settle(self, refusal: _Refusal, room: RoomView, now: float) -> bool:
        """Whether ``refusal``'s outcome is known at ``now`` (counted if so)."""
        ahead = refusal.ahead
        while ahead:
            left = _left_at(ahead[-1])
            if left is None:
                return False
            refusal.drained = max(refusal.drained, left)
            ahead.pop()
        last_start = refusal.deadline - refusal.own_s
        in_time = refusal.drained <= last_start
        regretted = in_time and room.had_room(refusal.earliest, min(last_start, now))
        if in_time and not regretted and now < last_start:
            return False  # a step with room may still come in time
        name = refusal.slo_class
        self.resolved[name] = self.resolved.get(name, 0) + 1
        if regretted:
            self.regretted[name] = self.regretted.get(name, 0) + 1
            if refusal.predicted and self._learn_from_regret:
                ttft = refusal.drained + refusal.own_s - refusal.arrival
                self._observe(name, ttft / refusal.predicted)
        return True


@dataclass(frozen=True, slots=True)
class SloFigures:
    """What the SLO bookkeeping reports (``EngineStats`` carries each figure): the median
    relative TTFT prediction error, overall (``None`` before the first checked
    prediction) and ``(slo_class, error)`` per class that has one; waiting requests
    shed past their deadline; refusals as ``(slo_class, code, count)`` (class ``""``
    for requests without one), sorted."""

    ttft_prediction_error: float | None
    ttft_prediction_error_by_class: tuple[tuple[str, float], ...]
    num_shed: int
    rejections: tuple[tuple[str, str, int], ...]


class SloTracker:
    """The scheduler's SLO state.

    ``ttft_errors`` / ``ttft_errors_by_class``: relative errors of admission's TTFT
    predictions against the first tokens that followed, overall and per class;
    ``rejections``: refusals by ``(slo_class, code)``; ``num_shed``: waiting requests
    ended past their deadline; ``output_lengths``: what each class's finished requests
    produced (``expected_output_tokens`` reads it for the TTFT forecast). Shedding (``admission.shed_after_deadline_s`` set) keeps
    a heap of ``(deadline + slack, seq, request)`` for every queued request with a
    class; entries of requests that ran or left are skipped when they come due.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self._classes = config.slo_classes
        self._default_class = config.default_slo_class
        self._shed_slack = config.admission.shed_after_deadline_s
        self._deadlines: list[tuple[float, int, Request]] = []
        self._seq = itertools.count()
        # (arrival s, prompt tokens, priority) of the last queued requests: the admitted
        # rates, overall and of the requests that outrank a priority.
        self._recent: deque[tuple[float, int, int]] = deque(maxlen=RECENT_ADMITS)
        self.ttft_errors = ErrorWindow()
        self.ttft_errors_by_class: dict[str, ErrorWindow] = {}
        self.rejections: dict[tuple[str | None, str], int] = {}
        self.num_shed = 0
        self.output_lengths = OutputLengths()

    def figures(self) -> SloFigures:
        """A snapshot of the figures this tracker keeps, for the engine's stats."""
        return SloFigures(
            ttft_prediction_error=self.ttft_errors.median,
            ttft_prediction_error_by_class=tuple(
                (name, error)
                for name, window in sorted(self.ttft_errors_by_class.items())
                if (error := window.median) is not None
            ),
            num_shed=self.num_shed,
            rejections=tuple(
                sorted((c or "", code, n) for (c, code), n in self.rejections.items())
            ),
        )

    def on_submit(self, request: Request) -> None:
        """Give a new request its class: its own, else ``default_slo_class``;
        ``AdmissionError`` (naming ``slo_class``) for a class that is not configured."""
        name = request.slo_class if request.slo_class is not None else self._default_class
        if name is not None and name not in self._classes:
            known = ", ".join(self._classes) or "none configured"
            raise AdmissionError(
                f"slo_class: unknown SLO class {name!r}; known: {known}", param="slo_class"
            )
        assign_class(request, name, self._classes)

    def on_refused(self, request: Request, code: str) -> None:
        key = (request.slo_class, code)
        self.rejections[key] = self.rejections.get(key, 0) + 1

    def on_queued(self, request: Request) -> None:
        """A request was accepted into the waiting queue."""
        self._recent.append((request.arrival_time, request.num_prompt_tokens, request.priority))
        if self._shed_slack is not None and request.ttft_target_s is not None:
            due = request.ttft_deadline + self._shed_slack
            heapq.heappush(self._deadlines, (due, next(self._seq), request))

    def on_first_token(self, request: Request, now: float) -> None:
        """Check admission's TTFT prediction (if it made one) against ``now``."""
        predicted = request.predicted_ttft_s
        if predicted is None:
            return
        actual = now - request.arrival_time
        self.ttft_errors.observe(predicted, actual)
        if request.slo_class is not None:
            window = self.ttft_errors_by_class.setdefault(request.slo_class, ErrorWindow())
            window.observe(predicted, actual)

    def on_finished(self, request: Request) -> None:
        """A request left the scheduler (its status says how): one that finished on its
        own teaches its class's output length; aborted, failed or shed ones do not."""
        if request.status in _NATURAL_ENDS:
            stopped = request.status == RequestStatus.FINISHED_STOPPED
            self.output_lengths.observe(request.slo_class, request.num_output_tokens, stopped)

    def expected_output_tokens(self, request: Request) -> int:
        """Output tokens ``request`` is expected to produce in all (``OutputLengths``)."""
        return self.output_lengths.expected(request)

    def has_due(self, now: float) -> bool:
        """Whether a deadline (plus slack) passed before ``now``; O(1)."""
        return bool(self._deadlines) and self._deadlines[0][0] < now

    def due(self, now: float, live: Mapping[str, Request]) -> Iterator[Request]:
        """The requests to shed now: those whose deadline plus slack passed before
        ``now`` and that are still waiting (in ``live``, by id) without a token. The
        caller ends each (``shed_error`` says why); entries of requests that ran or
        left are dropped."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < now:
            request = heapq.heappop(deadlines)[2]
            if (
                live.get(request.request_id) is request
                and request.status != RequestStatus.RUNNING
                and request.first_token_time is None
            ):
                yield request

    def shed_error(self, request: Request, now: float) -> str:
        """Count ``request`` as shed and say why, for its error output."""
        self.num_shed += 1
        late_ms = (now - request.ttft_deadline) * 1e3
        target_ms = (request.ttft_deadline - request.arrival_time) * 1e3
        source = (
            "its own target"
            if request.own_ttft_s is not None
            else f"SLO class {request.slo_class!r}"
        )
        return (
            f"ended before its first token: its TTFT deadline ({target_ms:,.0f} ms, "
            f"{source}) passed {late_ms:,.0f} ms ago"
        )

    def admitted_rate(self, better_than: int | None = None) -> ArrivalRate:
        """The rate of the last (up to ``RECENT_ADMITS``) queued requests, by arrival
        time: all of them, or with ``better_than`` those of a priority below it (better);
        zero with fewer than two."""
        recent = self._recent
        span = recent[-1][0] - recent[0][0] if len(recent) >= 2 else 0.0
        if span <= 0:
            return ArrivalRate(0.0, 0.0)
        later = list(recent)[1:]  # the first arrival only opens the span
        if better_than is not None:
            later = [r for r in later if r[2] < better_than]
        return ArrivalRate(sum(r[1] for r in later) / span, len(later) / span)


def slo_step_budget(
    config: SchedulerConfig, running: Sequence[Request], predictor: StepTimePredictor
) -> int:
    """The SLO-derived token budget (tokens): the running requests' decode tokens plus the
    largest prefill for which the predicted step time stays within ``slo_budget.margin``
    x the tightest TPOT target among ``running`` (``slo_budget.default_tpot_ms`` for one
    without a target; at least ``min_prefill_tokens``, at most ``max_num_tokens`` in
    all); ``max_num_tokens`` when no running request has a target, or while the
    predictor is not trusted (a wrong fit must not starve prefill). A binary search over
    the prefill size: about a dozen predictions."""
    default_ms = config.slo_budget.default_tpot_ms
    targets = [r.tpot_target_s for r in running if r.tpot_target_s is not None]
    if default_ms is not None and len(targets) < len(running):
        targets.append(default_ms / 1000)
    if not targets or not predictor.trusted:
        return config.max_num_tokens
    limit = min(targets) * config.slo_budget.margin
    decodes = len(running)
    context = sum(r.num_computed_tokens for r in running)
    predict, chunk = predictor.predict, config.chunk_size
    lo, hi = 0, config.max_num_tokens - decodes
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict(mixed_step(decodes, context, mid, math.ceil(mid / chunk))) <= limit:
            lo = mid
        else:
            hi = mid - 1
    prefill = max(lo, config.slo_budget.min_prefill_tokens)
    return max(1, min(config.max_num_tokens, decodes + prefill))
