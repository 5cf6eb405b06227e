"""The drain model admission decides with: ``Forecast`` (when would a request's first
token come, how long until the queue drains) and ``Bookings`` (refused requests told to
come back).

The model, from the scheduler's state at a submission (``view.SchedulerView``):

- each step runs the running requests' decode tokens and ``P = budget - D`` prefill
  tokens (``D`` running requests; ``budget`` is ``max_num_tokens``, or the SLO-derived
  budget when that is on), and takes the step-time predictor's time ``T`` for that
  shape;
- a request's first token comes once the prefill ahead of it (running requests'
  unfinished prompts, the waiting requests ahead of it in policy order, then its own
  prompt, at most ``chunk_size`` per step for itself) has run, and, when the batch is
  full, once it has a slot: one evicted for it (priority preemption takes a running
  request of worse priority, one per step) or one freed by a running request that
  finishes (after its expected output length, one token per step:
  ``slo.OutputLengths``, the request's ``max_tokens`` capped by what its class usually
  produces);
- later arrivals: those that will rank ahead of the request (a better priority, under
  an ordering that ranks by it) queue ahead of it until it enters the batch, with the
  running requests they evict from a full batch; the others take the budget a step
  leaves, while the batch has slots for them; both at their recent admitted rates;
- a request submitted while a step is in flight (the simulator's arrivals; the gateway
  submits between steps) first waits for that step to end.

The model is deliberately simple (no KV pressure; arrivals at their mean rate, in
prompts of their mean length); the engine tracks its error against the TTFTs that
follow (``EngineStats.ttft_prediction_error``). Two more simplifications, both
measured against the scheduler: ``D`` counts every running request, so one still in
its prompt (which takes a chunk, not a decode token) is charged a token of every step's
prefill budget, and the forecast runs late behind running prompts; and only the
running requests free slots, so in a batch filled by requests that entered from the
queue after the forecast (a small ``max_batch_size`` behind a long queue) the forecast
runs early, by as long as those requests hold their slots.

The forecast is checked against the strategy it imitates, not derived from it:
``tests/unit/test_forecast_vs_strategy.py`` runs the real ``Scheduler`` and its
continuous batching on generated queues (a fake executor, one second a step, which
the predictor knows) and compares each queued request's first token with
``first_token_s``: equal where the model is exact (queued requests that end on their
first token behind running decodes, batch cap and KV pool out of reach), and no earlier
and at most ``ceil(ahead x wait / P)`` steps later where queued requests go on to
decode (each request ahead then takes a token a step that the model leaves to
prefill). One pure function for both was the other way, and was not taken: a step
allocates blocks, preempts and moves requests between queues as it decides, while the
forecast replays thousands of steps ahead on expected output lengths and mean arrival
rates; a function both could call would carry the forecast's assumptions into the
hottest path or the scheduler's mutable state into the forecast.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence

from orchestrator.core.predictor import StepFeatures, mixed_step
from orchestrator.core.sched.slo import ArrivalRate
from orchestrator.core.sched.view import SchedulerView

# A replay longer than this many steps predicts far past any TTFT target anyway.
_MAX_REPLAY_STEPS = 20_000
# How long past its due time (the whole second its Retry-After named) a refused
# request's booking is kept (s): a client takes a moment to send again. Each second
# more is a second in which a client that never returns holds capacity for itself.
RETURN_GRACE_S = 1.0
# The learned return rate is the share of the last RETURN_WINDOW settled bookings
# (came back, or lapsed) that came back, counted against RETURN_PRIOR_MISSES more that
# did not: it starts at 0 and follows the evidence within a few settlements.
RETURN_WINDOW = 32
RETURN_PRIOR_MISSES = 2


class _Prompt:
    """A prompt being prefilled in the replay: ``left`` tokens still to run of its
    ``length``; ``index`` is its place among the waiting requests (-1 for a running
    request's)."""

    __slots__ = ("index", "left", "length")

    def __init__(self, left: int, length: int, index: int) -> None:
        self.left, self.length, self.index = left, length, index


class _StepLoad:
    """The prefill of one replayed step: ``left`` of the budget, ``tokens`` run in
    ``chunks``, ``cached`` positions read and causal attention ``pairs``."""

    __slots__ = ("cached", "chunks", "left", "pairs", "tokens")

    def __init__(self, budget: int) -> None:
        self.left, self.tokens, self.chunks, self.cached, self.pairs = budget, 0, 0, 0, 0

    def run(self, n: int, position: int) -> None:
        """Add a chunk of ``n`` tokens starting at ``position`` of its prompt."""
        self.left, self.tokens, self.chunks = self.left - n, self.tokens + n, self.chunks + 1
        self.cached, self.pairs = (
            self.cached + position,
            self.pairs + n * position + n * (n + 1) // 2,
        )


class _Overtakers:
    """Later arrivals that rank ahead of the request being forecast (a better priority
    under an ordering that ranks by it): prompts of ``prompt`` tokens on average at
    ``tokens_per_s``, each queued just ahead of the request until it enters the batch.
    When each evicts a running request for its slot (a full batch under priority
    preemption), the victim, ``victim`` tokens to recompute, queues ahead too: it ranks
    before a later arrival of its own priority. ``pending``: tokens arrived but not yet
    a whole mean prompt."""

    __slots__ = ("pending", "prompt", "tokens_per_s", "victim")

    def __init__(self, rate: ArrivalRate, victim: int = 0) -> None:
        self.tokens_per_s = rate.tokens_per_s
        self.prompt = rate.tokens_per_s / rate.requests_per_s if rate.requests_per_s else 0.0
        self.pending = 0.0
        self.victim = victim

    def arrive(self, seconds: float, waiting: list[int], own_index: int) -> int:
        """Queue the prompts that arrive over ``seconds`` ahead of ``waiting[own_index]``;
        returns its index after them."""
        if self.prompt <= 0:
            return own_index
        self.pending += self.tokens_per_s * seconds
        while self.pending >= self.prompt:
            waiting.insert(own_index, max(round(self.prompt), 1))
            own_index += 1
            if self.victim:
                waiting.insert(own_index, self.victim)
                own_index += 1
            self.pending -= self.prompt
        return own_index


class Forecast:
    """The scheduler's drain rate at ``now`` (s, the engine's clock): ``prefill_per_step``
    prefill tokens per step beside the current decode load, each step timed by the
    step-time predictor for the prefill it actually carries, after ``in_flight_s`` for
    a step still running."""

    def __init__(self, scheduler: SchedulerView, now: float) -> None:
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
        self._evict = 0  # slots the request being forecast may take by eviction
        self.in_flight_s = max(0.0, scheduler.step_end_time - now)
        self.arrival_tokens_per_s = scheduler.admitted_rate().tokens_per_s
        self._view = scheduler
        # Priorities of the running requests that priority preemption may still evict
        # (under the preemption cap), ascending; empty when it is off.
        self._evictable: list[int] = (
            sorted(r.priority for r in running if r.num_preemptions < cfg.max_preemptions)
            if scheduler.preempt_for_priority
            else []
        )

    def evictable(self, priority: int | None) -> int:
        """How many running requests a waiting request of ``priority`` may evict for a
        slot (a worse priority, under ``max_preemptions``); 0 for ``None`` or with
        priority preemption off."""
        if priority is None or not self._evictable:
            return 0
        return len(self._evictable) - bisect.bisect_right(self._evictable, priority)

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

    def _remaining_outputs(self) -> list[int]:
        """Output tokens (one per step) each running request is expected to have left
        (its expected length, ``SloTracker.expected_output_tokens``), ascending."""
        if self._remaining is None:
            expected = self._view.slo.expected_output_tokens
            self._remaining = sorted(
                max(expected(r) - r.num_output_tokens, 1) for r in self._running
            )
        return self._remaining

    def _slot_wait_steps(self, needed: int) -> float:
        """Steps until ``needed`` running requests have finished (one token per step each,
        up to their expected output length); beyond the running batch, each further batch takes
        as long as the mean running request."""
        remaining = self._remaining_outputs()
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

    def first_token_s(
        self, ahead: Sequence[int], own_tokens: int, priority: int | None = None
    ) -> float:
        """Seconds from now until the first token of a request with ``own_tokens`` to
        prefill, queued behind waiting requests with ``ahead`` tokens each (policy order);
        ``priority`` is the request's, when priority preemption may make room for it.

        A step-by-step replay of the continuous strategy: running requests' unfinished
        prompts first, then waiting requests in order, each getting at most
        ``chunk_size`` tokens of the step's prefill budget; a waiting request enters only
        once the batch has a free slot: a free one, one evicted for it (with priority
        preemption on, a running request of worse priority than ``priority``, one per
        step: the scheduler evicts only for the head of the queue), or one freed by a
        running request that finishes after its expected remaining output; the waiting
        requests ahead are taken to rank like the request itself (they are ahead in
        policy order). A request whose prompt is done joins the decodes. Later arrivals
        that outrank the request queue just ahead of it until it enters; the others take
        the budget a step leaves while the batch has slots (``_overtakers``). Each step
        is timed by the predictor for the tokens it carries. O(steps x requests per
        step).
        """
        waiting = [*ahead, own_tokens]
        own_index = len(waiting) - 1
        free = self.max_batch_size - self.num_running
        self._evict = self.evictable(priority)
        overtakers, later_tokens_per_s = self._overtakers(priority)
        active = [_Prompt(n, n, -1) for n in self._running_prefill_list]
        decodes, context = self.num_running - len(active), self.decode_context
        last_s = self.step_s(0)
        t, seen = self.in_flight_s, 0.0  # seen: arrivals counted up to then (s)
        step, nxt, arrived = 0, 0, 0
        for _ in range(_MAX_REPLAY_STEPS):
            if nxt <= own_index and t > seen:
                own_index, seen = overtakers.arrive(t - seen, waiting, own_index), t
            load = _StepLoad(self.prefill_per_step)
            self._continue_prompts(load, active)
            nxt = self._enter_waiting(load, active, waiting, nxt, free, step)
            slots = self._slots_left(free, nxt, step) - arrived
            arrived += self._add_later_arrivals(load, later_tokens_per_s * last_s, slots)
            if load.tokens == 0:
                # Nothing can run until a slot frees: decode-only steps until then.
                ready = math.ceil(self._slot_ready(nxt, free)) if nxt < len(waiting) else step + 1
                t += max(ready - step, 1) * self.step_s(0)
                step = max(ready, step + 1)
                continue
            last_s = self._load_s(load, decodes, context)
            t += last_s
            step += 1
            done = [p for p in active if p.left == 0]
            if done:
                active = [p for p in active if p.left > 0]
                for p in done:
                    if p.index == own_index:
                        return t
                    decodes, context = decodes + 1, context + p.length
        return t

    def _load_s(self, load: _StepLoad, decodes: int, context: int) -> float:
        """Predicted seconds of a replayed step: ``load``'s prefill beside ``decodes``
        decoding requests with ``context`` cached tokens between them."""
        return self._predict(
            StepFeatures(
                decodes + load.tokens,
                decodes + load.chunks,
                decodes + load.chunks,
                context + load.cached,
                context + decodes + load.pairs,
            )
        )

    def _continue_prompts(self, load: _StepLoad, active: list[_Prompt]) -> None:
        """The step's chunks for prompts already being prefilled, in order."""
        chunk = self.chunk_size
        for prompt in active:
            if load.left == 0:
                break
            n = min(prompt.left, chunk, load.left)
            position = prompt.length - prompt.left
            prompt.left -= n
            load.run(n, position)

    def _enter_waiting(
        self,
        load: _StepLoad,
        active: list[_Prompt],
        waiting: list[int],
        nxt: int,
        free: int,
        step: int,
    ) -> int:
        """Start waiting prompts from index ``nxt`` while the budget lasts and their slot
        is ready by ``step``; returns the index of the next one to start."""
        chunk = self.chunk_size
        while load.left > 0 and nxt < len(waiting) and self._slot_ready(nxt, free) <= step:
            n = min(waiting[nxt], chunk, load.left)
            active.append(_Prompt(waiting[nxt] - n, waiting[nxt], nxt))
            load.run(n, 0)
            nxt += 1
        return nxt

    def _overtakers(self, priority: int | None) -> tuple[_Overtakers, float]:
        """The later arrivals that will rank ahead of a request of ``priority``, and the
        rate (prompt tokens/s) of the others, which only fill budget left over."""
        view = self._view
        if priority is None or not view.ordering.ranks_by_priority:
            return _Overtakers(ArrivalRate(0.0, 0.0)), self.arrival_tokens_per_s
        ahead = view.admitted_rate(priority)
        decodes = self.num_running - len(self._running_prefill_list)
        full = self.num_running >= self.max_batch_size and decodes > 0
        victim = self.decode_context // decodes if full and self._evictable else 0
        rest = max(self.arrival_tokens_per_s - ahead.tokens_per_s, 0.0)
        return _Overtakers(ahead, victim), rest

    def _add_later_arrivals(self, load: _StepLoad, tokens: float, slots: int) -> int:
        """Later arrivals take up to ``tokens`` of the budget this step leaves (their
        recent rate over the previous step's time), but only into the batch's ``slots``
        left free (a full batch admits no one: the scheduler needs a slot per request).
        Returns how many arrivals entered (one per ``chunk_size`` of their tokens, a lower
        bound on their number)."""
        if not (slots > 0 and load.left > 0 and load.tokens and tokens >= 1):
            return 0
        extra = min(load.left, int(tokens), slots * self.chunk_size)
        k = math.ceil(extra / self.chunk_size)
        per = extra // k
        load.tokens, load.chunks = load.tokens + extra, load.chunks + k
        load.pairs += k * per * per // 2
        return k

    def _slots_left(self, free: int, entered: int, step: int) -> int:
        """Batch slots free at ``step`` once ``entered`` waiting requests took theirs: the
        ``free`` ones, those evicted for them (``self._evict`` at most), and those of
        running requests finished by then."""
        evicted = min(self._evict, max(entered - free, 0))
        return free + evicted + self._finished_by(step) - entered

    def _finished_by(self, step: int) -> int:
        """How many running requests have finished (their remaining outputs) by ``step``."""
        return bisect.bisect_right(self._remaining_outputs(), step)

    def _slot_ready(self, index: int, free: int) -> float:
        """The step from which waiting request ``index`` (0-based, in order) has a slot:
        at once for the ``free`` ones, one step apart for those that evict a running
        request (``self._evict`` of them), then as running requests finish."""
        if index < free:
            return 0.0
        if index < free + self._evict:
            return float(index - free)
        return self._slot_wait_steps(index - free - self._evict + 1)


class Bookings:
    """Refused requests told to come back, each with its due time (s, engine clock: the
    refusal plus the whole seconds of its ``Retry-After``), prompt tokens and prompt key
    (a hash of its prompt tokens, how its return is recognised).

    Not every client returns, so each booking counts as expected work with the learned
    ``return_rate``: of the last ``RETURN_WINDOW`` settled bookings (a client came back,
    or the booking lapsed ``RETURN_GRACE_S`` past due), the share that came back, with
    ``RETURN_PRIOR_MISSES`` more counted as lapsed. It starts at 0: a booking holds
    capacity only once clients are seen to come back, because until then the work it
    stands for is a guess, and a guess that refuses requests costs goodput for certain
    (on two CPU cores, bookings that began trusted at 1 kept a sustained overload
    refusing for 3 s after the queue had room, since the first evidence, a lapse, comes
    at least a second and the grace after the first refusal). A client that never
    retries thus holds no capacity others could use, and clients that do retry earn
    their places back within a few returns.
    """

    def __init__(self) -> None:
        self._due: list[tuple[float, int, int]] = []  # (due, tokens, key), by due
        self._settled: deque[bool] = deque(maxlen=RETURN_WINDOW)  # came back?

    def __len__(self) -> int:
        return len(self._due)

    @property
    def return_rate(self) -> float:
        """The expected share of bookings whose client comes back, in [0, 1)."""
        return sum(self._settled) / (len(self._settled) + RETURN_PRIOR_MISSES)

    def _settle(self, returned: bool) -> None:
        self._settled.append(returned)

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
