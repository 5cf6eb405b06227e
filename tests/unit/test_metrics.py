"""The metric definitions shared by the simulator, the benchmark client and the gateway."""

from __future__ import annotations

import math

import pytest

from orchestrator.common.metrics import SLO, Distribution, RequestRecord, percentile, summarize


def record(
    rid: str, arrival: float, times: list[float], n_out: int | None = None, **kw
) -> RequestRecord:  # type: ignore[no-untyped-def]
    return RequestRecord(
        rid, arrival, tuple(times), 10, n_out if n_out is not None else len(times), **kw
    )


def test_ttft_tpot_itl_and_e2e_of_one_request() -> None:
    r = record("a", 1.0, [1.5, 1.6, 1.8, 2.1])
    assert r.ttft == pytest.approx(0.5)
    assert r.tpot == pytest.approx((2.1 - 1.5) / 3)
    assert r.itls == pytest.approx([0.1, 0.2, 0.3])
    assert r.e2e == pytest.approx(1.1)


def test_tpot_counts_tokens_not_chunks() -> None:
    # Two chunks carrying 5 tokens: TPOT spreads the time over the 4 gaps between tokens.
    r = record("a", 0.0, [1.0, 2.0], n_out=5)
    assert r.tpot == pytest.approx(0.25)


def test_one_token_request_has_no_tpot_and_cannot_miss_a_tpot_bound() -> None:
    r = record("a", 0.0, [0.2])
    assert r.tpot is None and SLO(ttft_s=0.5, tpot_s=0.01).met_by(r)


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))
    d = Distribution.of([4, 1, 3, 2])
    assert d.mean == 2.5 and d.p[50] == 2.5 and d.p[99] == pytest.approx(3.97)


def test_goodput_counts_completed_requests_meeting_every_bound() -> None:
    records = [
        record("fast", 0.0, [0.1, 0.2, 0.3]),  # TTFT 0.1, TPOT 0.1: meets both
        record("slow-start", 0.0, [0.9, 1.0]),  # TTFT 0.9: misses TTFT
        record("slow-decode", 0.0, [0.1, 0.6]),  # TPOT 0.5: misses TPOT
        record("failed", 0.0, [], error="HTTP 500", status_code=500),
    ]
    s = summarize(records, duration_s=2.0, slo=SLO(ttft_s=0.5, tpot_s=0.2), num_gpus=2)
    assert (s.num_requests, s.num_completed, s.num_errors) == (4, 3, 1)
    assert s.goodput == pytest.approx(0.5) and s.goodput_fraction == pytest.approx(0.25)
    assert s.output_tokens == 7 and s.output_throughput == pytest.approx(3.5)
    assert s.output_throughput_per_gpu == pytest.approx(1.75)
    assert s.errors_by_status == {"500": 1}
    assert s.ttft.p[50] == pytest.approx(0.1)
