"""Timing an executor on chosen step shapes, through the ``Executor`` protocol only:
plain ``SchedulerOutput`` plans of synthetic requests on disjoint KV blocks.

Two users: the engine, which before it serves fits its step-time predictor's prior on
the loaded executor (``startup_shapes``, ``calibrate_prior``); and ``orchestrator
calibrate``, which times its own shapes for an offline hardware profile.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from orchestrator.core.config import SchedulerConfig, StepTimePrior
from orchestrator.core.executor import Executor
from orchestrator.core.output import ScheduledRequest, SchedulerOutput
from orchestrator.core.predictor import features_of, fit_prior
from orchestrator.core.request import SamplingParams

# A step shape: (new tokens, cached positions) per request.
Shape = Sequence[tuple[int, int]]


def shape_plan(shape: Shape, block_size: int) -> SchedulerOutput:
    """A plan of one request per ``(new tokens, cached positions)`` entry, on disjoint
    blocks from 0, every request sampling."""
    params = SamplingParams(max_tokens=1, temperature=0.0)
    scheduled, block = [], 0
    for i, (n, cached) in enumerate(shape):
        blocks = math.ceil((cached + n) / block_size)
        table = list(range(block, block + blocks))
        block += blocks
        scheduled.append(
            ScheduledRequest(
                request_id=f"cal-{i}",
                token_ids=[1] * n,
                start_position=cached,
                block_table=table,
                sample=True,
                sampling=params,
            )
        )
    return SchedulerOutput(scheduled=scheduled)


def time_step(executor: Executor, plan: SchedulerOutput, repeats: int) -> float:
    """Median of ``repeats`` step durations (s) after one warm-up step, which is
    discarded: the first run of a shape pays one-off costs (allocations, kernel
    selection, cold caches) that later steps of that shape do not."""
    executor.execute(plan)
    return statistics.median(executor.execute(plan).duration_s for _ in range(repeats))


def blocks_of(shape: Shape, block_size: int) -> int:
    return sum(math.ceil((cached + n) / block_size) for n, cached in shape)


def _within(shape: Shape, config: SchedulerConfig, num_blocks: int, block_size: int) -> Shape:
    """``shape`` shrunk until it fits the KV pool and the step budget: fewer requests
    first, then fewer tokens and positions; empty if even one token does not fit."""

    def fits(s: Shape) -> bool:
        return (
            blocks_of(s, block_size) <= num_blocks and sum(n for n, _ in s) <= config.max_num_tokens
        )

    shape = list(shape[: config.max_batch_size])
    while len(shape) > 1 and not fits(shape):
        shape = shape[: len(shape) // 2]
    n, cached = shape[0]
    while not fits([(n, cached)]) and (n > 1 or cached > 0):
        n, cached = max(1, n // 2), cached // 2
    return shape if len(shape) > 1 else ([(n, cached)] if fits([(n, cached)]) else [])


def startup_shapes(config: SchedulerConfig, num_blocks: int, block_size: int) -> list[Shape]:
    """The shapes admission and the SLO budget predict, within this engine's limits: a
    full prefill chunk and a quarter one (tokens against attention pairs), decodes at
    1, 1/8 and all of the batch cap over three contexts (the fixed cost against the
    per-request and per-position ones), and half a chunk beside decodes."""
    chunk = max(1, min(config.chunk_size, config.max_num_tokens))
    some = max(1, config.max_batch_size // 8)
    wanted: list[Shape] = [
        [(chunk, 0)],
        [(max(1, chunk // 4), 0)],
        [(1, 128)],
        [(1, 128)] * some,
        [(1, 512)] * some,
        [(1, 256)] * config.max_batch_size,
        [(max(1, chunk // 2), 0)] + [(1, 256)] * some,
    ]
    shapes = [_within(s, config, num_blocks, block_size) for s in wanted]
    return [s for s in shapes if s]


def calibrate_prior(
    executor: Executor, shapes: Sequence[Shape], block_size: int, repeats: int = 3
) -> tuple[StepTimePrior, list[tuple[Shape, float]]]:
    """Time each shape (``time_step``), fit the linear step-time model to them and
    return it with the measured ``(shape, seconds)``. The synthetic requests are then
    named finished, so the executor drops whatever state it keeps for them."""
    measured = [
        (shape, time_step(executor, shape_plan(shape, block_size), repeats)) for shape in shapes
    ]
    executor.execute(
        SchedulerOutput(finished_ids=[f"cal-{i}" for i in range(max(map(len, shapes), default=0))])
    )
    prior = fit_prior((features_of(shape_plan(s, block_size)), t) for s, t in measured)
    return prior, measured
