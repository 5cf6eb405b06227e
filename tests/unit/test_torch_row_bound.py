"""The compact projections' row bound, measured at start: the decision rule on given
timings, and a measurement on a tiny model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from plugins.torch_executor.compact import WeightFormat
from plugins.torch_executor.native import COMPACT_MAX_ROWS, load_kernels
from plugins.torch_executor.row_bound import CANDIDATES, CLEAR_WIN, choose, measure, search
from plugins.torch_executor.runner import ModelRunner
from plugins.torch_executor.weights import load_folder
from tests.e2e.models import write_tiny_llama


def test_the_bound_is_the_last_row_count_before_the_dense_matmul_first_wins() -> None:
    assert choose({4: (1.0, 2.0), 8: (2.0, 2.0), 16: (3.5, 3.0), 32: (1.0, 9.0)}) == 8
    assert choose({4: (1.0, 2.0), 8: (1.5, 2.0)}) == 8  # never lost: the largest measured
    assert choose({4: (2.1, 2.0)}) == 1  # lost at once: one row (a pure read of fewer bytes)


class Clock:
    """A fake clock: ``estimates`` moves it ``cost_s`` per row count it estimates."""

    def __init__(self, cost_s: float) -> None:
        self.now = 0.0
        self.cost_s = cost_s

    def __call__(self) -> float:
        return self.now


def estimates(
    table: dict[int, tuple[float, float]], clock: Clock, asked: list[int]
) -> Callable[[int], tuple[float, float]]:
    def estimate(rows: int) -> tuple[float, float]:
        asked.append(rows)
        clock.now += clock.cost_s
        return table[rows]

    return estimate


def test_a_clear_win_at_the_largest_count_settles_the_bound_at_once() -> None:
    largest = CANDIDATES[-1]
    asked: list[int] = []
    table = {largest: (1.0, CLEAR_WIN)}
    clock = Clock(0.0)
    bound = search(estimates(table, clock, asked), clock=clock)
    assert asked == [largest] and bound.rows == largest and bound.timings == table


def test_without_a_clear_win_the_search_goes_up_from_the_smallest() -> None:
    # The compact weights win the largest count by less than CLEAR_WIN and lose at 24.
    table = {r: (1.0, 1.1) for r in CANDIDATES} | {24: (1.2, 1.1)}
    asked: list[int] = []
    clock = Clock(0.0)
    bound = search(estimates(table, clock, asked), clock=clock)
    assert asked == [CANDIDATES[-1], 4, 8, 16, 24]
    assert bound.rows == 16 and list(bound.timings) == [4, 8, 16, 24]


def test_going_up_stops_at_the_budget_and_keeps_what_it_measured() -> None:
    table = {r: (1.0, 1.1) for r in CANDIDATES}  # the compact weights never lose
    asked: list[int] = []
    clock = Clock(4.0)  # each count "takes" 4 s: the top one, then 4 and 8 pass 10 s
    bound = search(estimates(table, clock, asked), budget_s=10.0, clock=clock)
    assert asked == [CANDIDATES[-1], 4, 8]
    assert bound.rows == 8 and list(bound.timings) == [4, 8]


@pytest.fixture(scope="module")
def runner_parts(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    kernels = load_kernels(Path(tmp_path_factory.mktemp("kernels")))
    if kernels is None:
        pytest.skip("the CPU kernels cannot be built here (no C++ compiler)")
    folder = write_tiny_llama(
        tmp_path_factory.mktemp("tiny"), hidden_size=64, intermediate_size=128
    )
    return kernels, load_folder(folder, torch.float32)


def test_a_measurement_stops_at_the_first_loss_and_picks_by_the_rule(runner_parts: tuple) -> None:
    kernels, weights = runner_parts
    bound = measure(kernels, weights, WeightFormat.INT8)
    measured = list(bound.timings)
    if measured == [CANDIDATES[-1]]:  # a clear win at the largest count
        compact, dense = bound.timings[CANDIDATES[-1]]
        assert compact * CLEAR_WIN <= dense and bound.rows == CANDIDATES[-1]
        return
    assert measured == list(CANDIDATES[: len(measured)])
    assert all(c > 0 and d > 0 for c, d in bound.timings.values())
    losses = [r for r, (c, d) in bound.timings.items() if c > d]
    assert losses in ([], [measured[-1]]), "it stops at the first loss"
    assert bound.rows == choose(bound.timings)
    assert f"up to {bound.rows} rows" in bound.describe()


def test_the_runner_measures_only_for_compact_weights(runner_parts: tuple) -> None:
    kernels, weights = runner_parts
    rng = torch.Generator()
    compact = ModelRunner(weights, 8, 16, 64, rng, kernels, weights_format=WeightFormat.INT8)
    assert compact.row_bound is not None
    assert compact.compact_max_rows == compact.row_bound.rows
    assert compact.stack is not None and compact.stack.max_rows == compact.row_bound.rows
    dense = ModelRunner(weights, 8, 16, 64, rng, kernels)
    assert dense.row_bound is None and dense.compact_max_rows == COMPACT_MAX_ROWS
    given = ModelRunner(
        weights, 8, 16, 64, rng, kernels, weights_format=WeightFormat.INT8, compact_max_rows=5
    )
    assert given.row_bound is None and given.stack is not None and given.stack.max_rows == 5
