"""How many rows of a request attend through the paged kernel, measured at start: the
decision rule on given timings, a measurement on a tiny model, and what the runner
does with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from plugins.torch_executor.attention_bound import (
    CANDIDATES,
    EVERY_CHUNK,
    choose,
    measure,
    scan,
)
from plugins.torch_executor.model import RotaryTable
from plugins.torch_executor.native import load_kernels
from plugins.torch_executor.paged import KERNEL_MAX_ROWS
from plugins.torch_executor.runner import ModelRunner
from plugins.torch_executor.weights import load_folder
from tests.e2e.models import write_tiny_llama


def test_the_bound_is_the_last_row_count_before_sdpa_first_wins() -> None:
    assert choose({32: (1.0, 2.0), 64: (2.0, 2.0), 128: (3.5, 3.0), 256: (1.0, 9.0)}) == 64
    assert choose({32: (1.0, 2.0), 64: (1.5, 2.0)}) == EVERY_CHUNK  # never lost
    assert choose({32: (2.1, 2.0)}) == KERNEL_MAX_ROWS  # lost at once: the fixed floor
    assert choose({}) == KERNEL_MAX_ROWS
    # Stopped at the budget before the kernel lost: no further than it measured.
    assert choose({32: (1.0, 2.0), 64: (1.5, 2.0)}, complete=False) == 64


def test_the_scan_stops_at_its_budget_and_says_so() -> None:
    now = [0.0]
    asked: list[int] = []

    def time_count(rows: int) -> tuple[float, float]:
        asked.append(rows)
        now[0] += 6.0  # each count "takes" 6 s: two pass a 10 s budget
        return 1.0, 2.0  # the kernel wins every count

    bound = scan(time_count, list(CANDIDATES), budget_s=10.0, clock=lambda: now[0])
    assert asked == list(CANDIDATES[:2])
    assert not bound.complete and bound.rows == CANDIDATES[1]
    assert "stopped at its time budget" in bound.describe()
    now[0], asked[:] = 0.0, []
    whole = scan(time_count, list(CANDIDATES), budget_s=1e9, clock=lambda: now[0])
    assert asked == list(CANDIDATES) and whole.complete and whole.rows == EVERY_CHUNK
    assert "budget" not in whole.describe()


@pytest.fixture(scope="module")
def runner_parts(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    kernels = load_kernels(Path(tmp_path_factory.mktemp("kernels")))
    if kernels is None:
        pytest.skip("the CPU kernels cannot be built here (no C++ compiler)")
    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny"), max_position_embeddings=1024)
    return kernels, load_folder(folder, torch.float32)


def test_a_measurement_stops_at_the_first_loss_and_picks_by_the_rule(runner_parts: tuple) -> None:
    kernels, weights = runner_parts
    rope = RotaryTable(weights.args, 1024, weights.dtype, "cpu")
    bound = measure(kernels, weights.args, rope, weights.dtype)
    assert bound is not None
    measured = list(bound.timings)
    assert measured == list(CANDIDATES[: len(measured)])
    assert all(k > 0 and s > 0 for k, s in bound.timings.values())
    losses = [r for r, (k, s) in bound.timings.items() if k > s]
    assert losses in ([], [measured[-1]]), "it stops at the first loss"
    assert bound.rows == choose(bound.timings)
    assert "paged-kernel attention for" in bound.describe()


def test_only_row_counts_the_model_length_holds_are_measured(runner_parts: tuple) -> None:
    kernels, weights = runner_parts
    short = RotaryTable(weights.args, 200, weights.dtype, "cpu")  # a chunk and as many cached
    bound = measure(kernels, weights.args, short, weights.dtype)
    assert bound is not None and set(bound.timings) <= {32, 64}
    too_short = RotaryTable(weights.args, 63, weights.dtype, "cpu")
    assert measure(kernels, weights.args, too_short, weights.dtype) is None


def test_the_runner_measures_with_the_kernels_unless_given_a_bound(runner_parts: tuple) -> None:
    kernels, weights = runner_parts
    rng = torch.Generator()
    measured = ModelRunner(weights, 8, 16, 1024, rng, kernels)
    assert measured.attention_bound is not None
    assert measured.kernel_max_rows == measured.attention_bound.rows >= KERNEL_MAX_ROWS
    given = ModelRunner(weights, 8, 16, 1024, rng, kernels, kernel_max_rows=40)
    assert given.attention_bound is None and given.kernel_max_rows == 40
    torch_ops = ModelRunner(weights, 8, 16, 1024, rng, None)
    assert torch_ops.attention_bound is None and torch_ops.kernel_max_rows == 1
