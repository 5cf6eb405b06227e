"""Shape buckets: bounded padding, few distinct shapes, and zero padding that changes no
real row."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from plugins.torch_executor.buckets import (  # noqa: E402
    CONTEXT_STEP,
    EXACT_ROWS,
    pad_dim,
    padded_context,
    padded_rows,
)


def test_small_row_counts_run_exactly() -> None:
    assert [padded_rows(r) for r in range(1, EXACT_ROWS + 1)] == list(range(1, EXACT_ROWS + 1))


def test_buckets_cover_and_waste_at_most_an_eighth() -> None:
    for rows in range(1, 5000):
        bucket = padded_rows(rows)
        assert rows <= bucket <= rows * 9 / 8, rows
        assert padded_rows(bucket) == bucket  # a bucket is its own bucket


def test_powers_of_two_are_buckets() -> None:
    assert [padded_rows(2**k) for k in range(12)] == [2**k for k in range(12)]


def test_distinct_buckets_grow_with_the_log_of_the_rows() -> None:
    # 8 exact counts, then 8 per power of two: 8 + 8 * log2(4096 / 8) = 80.
    assert len({padded_rows(r) for r in range(1, 4097)}) == 80
    assert len({padded_rows(r) for r in range(1, 257)}) == 48


def test_context_rounds_up_to_its_step() -> None:
    assert padded_context(1) == CONTEXT_STEP
    assert padded_context(CONTEXT_STEP) == CONTEXT_STEP
    assert padded_context(CONTEXT_STEP + 1) == 2 * CONTEXT_STEP


def test_pad_dim_appends_zeros_along_one_dimension() -> None:
    x = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    padded = pad_dim(x, 1, 5)
    assert padded.shape == (2, 5, 4)
    assert torch.equal(padded[:, :3], x)
    assert not padded[:, 3:].any()
    assert pad_dim(x, 0, 2) is x  # already that long: no copy
