"""The forecast against the strategy it imitates: the real ``Scheduler`` with its
continuous batching runs generated queues on the fake executor, one second a step (the
predictor knows it), and each queued request's first token comes when
``Forecast.first_token_s`` said it would: exactly where the forecast's model is exact,
within a stated bound where it knowingly leaves something out.

Both properties hold the batch cap and the KV pool out of reach (neither binds: the
forecast ignores KV pressure, and its slot model is coarse, see ``forecast.py``), and
every request arrives at time 0, so no later arrivals are expected. Each case is drawn
from its own seed, which a failure names."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from orchestrator.core.request import Request
from orchestrator.core.sched.forecast import Forecast
from tests.factories import make_engine, make_request, run_step

CASES = 200
# Output tokens of the requests already running: more than any case runs steps, so
# they decode throughout and free no slot.
LONG_OUTPUT = 2_000


@dataclass(frozen=True)
class Outcome:
    """One queued request: ``index`` requests ahead of it, the forecast's and the real
    wait for its first token (s, one step a second), the forecast's prefill per step."""

    index: int
    forecast_s: float
    actual_s: float
    prefill_per_step: int


def queued_outcomes(seed: int, max_output: int) -> list[Outcome]:
    """Run one generated case: a budget and chunk size, up to four requests already
    decoding (a few steps in), then up to seven queued with outputs of 1 to
    ``max_output`` tokens; forecast each queued request's first token from the queue at
    that moment, then run the engine until each has it."""
    rng = random.Random(seed)
    budget = rng.choice((16, 32, 64))
    engine, clock = make_engine(
        num_blocks=4096,
        step_time_s=1.0,
        exact_predictor=True,
        max_num_tokens=budget,
        chunk_size=rng.randint(2, budget),
        max_batch_size=budget,
        prefix_caching=False,
    )
    scheduler = engine.scheduler

    def prompt() -> list[int]:
        return [rng.randrange(1000) for _ in range(rng.randint(1, 3 * budget))]

    for i in range(rng.randint(0, 4)):
        running = make_request(request_id=f"r{i}", prompt=prompt(), max_tokens=LONG_OUTPUT)
        scheduler.add_request(running, 0.0)
    while any(r.num_output_tokens == 0 for r in scheduler.requests.values()):
        run_step(engine, clock)
    for _ in range(rng.randint(0, 3)):
        run_step(engine, clock)
    now = clock.now()
    queued: list[Request] = []
    for i in range(rng.randint(1, 7)):
        request = make_request(
            request_id=f"q{i}", prompt=prompt(), max_tokens=rng.randint(1, max_output)
        )
        scheduler.add_request(request, now)
        queued.append(request)
    forecast = Forecast(scheduler, now)
    predicted = [
        forecast.first_token_s(
            [r.num_expected_prefill_tokens for r in queued[:i]], request.num_uncomputed_tokens
        )
        for i, request in enumerate(queued)
    ]
    while any(r.first_token_time is None for r in queued):
        run_step(engine, clock)
    return [
        Outcome(i, predicted[i], r.first_token_time - now, forecast.prefill_per_step)
        for i, r in enumerate(queued)
        if r.first_token_time is not None
    ]


def test_the_forecast_is_the_strategys_schedule_where_its_model_is_exact() -> None:
    """Queued requests that end on their first token (so none of them decodes) behind
    requests that decode throughout: every step carries the running decodes and
    ``max_num_tokens`` less that many prefill tokens, as the forecast assumes, so its
    replay must give each request's first-token step exactly."""
    for seed in range(CASES):
        for o in queued_outcomes(seed, max_output=1):
            assert o.forecast_s == o.actual_s, f"seed {seed}: {o}"


def test_the_forecast_runs_early_by_at_most_the_decodes_of_the_requests_ahead() -> None:
    """Queued requests that decode once their prompt is done: each of the ``index``
    requests ahead then takes one token a step that the forecast leaves to prefill
    (``P`` tokens a step), so over the real wait ``a`` (steps) the first token comes
    no earlier than forecast and at most ``ceil(index * a / P)`` steps later."""
    for seed in range(CASES):
        for o in queued_outcomes(seed, max_output=30):
            late = o.actual_s - o.forecast_s
            bound = math.ceil(o.index * o.actual_s / o.prefill_per_step)
            assert 0 <= late <= bound, f"seed {seed}: {o}, {late} steps late, bound {bound}"
