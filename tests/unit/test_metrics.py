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


def test_per_class_summaries_judge_each_class_by_its_own_slo() -> None:
    from orchestrator.common.metrics import SLO, RequestRecord, summarize, summarize_by_class

    tight, loose = SLO(ttft_s=0.1), SLO(ttft_s=1.0, e2e_s=2.0)
    records = [
        RequestRecord("a", 0.0, (0.05, 0.1), 4, 2, slo_class="tight", predicted_ttft=0.04),
        RequestRecord("b", 0.0, (0.5, 0.6), 4, 2, slo_class="tight", predicted_ttft=0.25),
        RequestRecord("c", 0.0, (0.5, 0.6), 4, 2, slo_class="loose"),
        RequestRecord("d", 0.0, (0.5, 3.0), 4, 2, slo_class="loose"),  # misses e2e
        RequestRecord(
            "e", 0.0, (), 4, 0, "refused", 429, error_code="ttft_unattainable", slo_class="loose"
        ),
    ]
    by_class = summarize_by_class(records, {"tight": tight, "loose": loose}, SLO())
    assert (by_class["tight"].num_met, by_class["tight"].num_requests) == (1, 2)
    assert (by_class["loose"].num_met, by_class["loose"].num_requests) == (1, 3)
    assert by_class["loose"].rejections == {"ttft_unattainable": 1}
    # |0.04 - 0.05| / 0.05 = 0.2 and |0.25 - 0.5| / 0.5 = 0.5: median 0.35.
    assert by_class["tight"].ttft_prediction_error == pytest.approx(0.35)
    assert by_class["loose"].ttft_prediction_error is None
    summary = summarize(records, 10.0, SLO(), class_slos={"tight": tight, "loose": loose})
    assert summary.goodput_fraction == pytest.approx(2 / 5)
