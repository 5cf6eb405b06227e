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
from collections.abc import Sequence

from orchestrator.core.predictor import StepFeatures, mixed_step
from orchestrator.core.sched.view import SchedulerView

# A replay longer than this many steps predicts far past any TTFT target anyway.
_MAX_REPLAY_STEPS = 20_000
# How long past its due time a refused request's booking is kept (s): Retry-After is in
# whole seconds, rounded up, and a client takes a moment to send again.
RETURN_GRACE_S = 2.0
# Weight of each settled booking (came back, or lapsed) in the learned return rate.
RETURN_RATE_WEIGHT = 0.1


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
        active = [_Prompt(n, n, -1) for n in self._running_prefill_list]
        decodes, context = self.num_running - len(active), self.decode_context
        last_s = self.step_s(0)
        t = self.in_flight_s
        step, nxt = 0, 0
        for _ in range(_MAX_REPLAY_STEPS):
            load = _StepLoad(self.prefill_per_step)
            self._continue_prompts(load, active)
            nxt = self._enter_waiting(load, active, waiting, nxt, free, step)
            self._add_later_arrivals(load, last_s)
            if load.tokens == 0:
                # Nothing can run until a slot frees: decode-only steps until then.
                ready = math.ceil(self._slot_ready(nxt, free)) if nxt < len(waiting) else step + 1
                t += max(ready - step, 1) * self.step_s(0)
                step = max(ready, step + 1)
                continue
            last_s = self._predict(
                StepFeatures(
                    decodes + load.tokens,
                    decodes + load.chunks,
                    decodes + load.chunks,
                    context + load.cached,
                    context + decodes + load.pairs,
                )
            )
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

    def _add_later_arrivals(self, load: _StepLoad, last_s: float) -> None:
        """Later arrivals take the budget this step leaves: at the recent rate of admitted
        prompt tokens, over the previous step's time."""
        if not (load.left > 0 and load.tokens and self.arrival_tokens_per_s > 0):
            return
        extra = min(load.left, int(self.arrival_tokens_per_s * last_s))
        if extra:
            k = math.ceil(extra / self.chunk_size)
            per = extra // k
            load.tokens, load.chunks = load.tokens + extra, load.chunks + k
            load.pairs += k * per * per // 2

    def _slot_ready(self, index: int, free: int) -> float:
        """The step from which waiting request ``index`` (0-based, in order) has a slot."""
        return 0.0 if index < free else self._slot_wait_steps(index - free + 1)


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
