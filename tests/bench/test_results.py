"""Result files and tables on hand-made records: goodput arithmetic, JSON round trips,
and the ratios of a comparison."""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from orchestrator.bench.errors import BenchError
from orchestrator.bench.report import (
    compare_tables,
    latency_table,
    ratio_text,
    sweep_table,
    totals_table,
)
from orchestrator.bench.results import (
    BenchReport,
    RunSummary,
    read_records,
    read_report,
    summary_to_json,
    write_records,
    write_report,
)
from orchestrator.common.metrics import SLO, RequestRecord, summarize

SLO_500_80 = SLO(ttft_s=0.5, tpot_s=0.08)


def record(rid: str, ttft: float, tpot: float, n: int, **kw: object) -> RequestRecord:
    """A request sent at 0 whose ``n`` tokens arrive ``ttft`` then every ``tpot`` s."""
    times = tuple(ttft + i * tpot for i in range(n))
    return RequestRecord(rid, 0.0, times, num_prompt_tokens=10, num_output_tokens=n, **kw)  # type: ignore[arg-type]


def hand_made() -> list[RequestRecord]:
    return [
        record("good", ttft=0.1, tpot=0.05, n=11),  # meets both bounds
        record("slow-first", ttft=0.6, tpot=0.05, n=11),  # misses TTFT
        record("slow-decode", ttft=0.2, tpot=0.1, n=5),  # misses TPOT
        record("one-token", ttft=0.3, tpot=0.0, n=1),  # no TPOT: cannot miss it
        RequestRecord("rejected", 0.0, (), 10, 0, error="queue full", status_code=429),
    ]


def render(*tables: object) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    for t in tables:
        console.print(t)
    return console.export_text()


def test_goodput_counts_requests_meeting_every_bound():
    s = summarize(hand_made(), duration_s=2.0, slo=SLO_500_80)
    assert (s.num_requests, s.num_completed, s.num_errors) == (5, 4, 1)
    assert s.goodput == pytest.approx(2 / 2.0)  # "good" and "one-token"
    assert s.goodput_fraction == pytest.approx(2 / 5)
    assert s.output_throughput == pytest.approx((11 + 11 + 5 + 1) / 2.0)
    assert s.errors_by_status == {"429": 1}
    text = render(totals_table(s))
    assert "Goodput (TTFT ≤ 500 ms, TPOT ≤ 80 ms)" in text
    assert "1.000 req/s (40.0% of requests)" in text
    assert "4 completed of 5" in text
    assert "1 (429: 1)" in text
    assert "14.0 tok/s" in text


def test_latency_table_shows_milliseconds():
    s = summarize(hand_made(), duration_s=2.0, slo=SLO_500_80)
    text = render(latency_table(s))
    ttft_row = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("TTFT"))
    # TTFTs 100, 600, 200, 300 ms: mean 300, p50 250.
    assert "300.0" in ttft_row and "250.0" in ttft_row


def test_summary_json_round_trips_including_undefined_values(tmp_path):
    one_token_only = [record("a", ttft=0.2, tpot=0.0, n=1)]
    summaries = [
        summarize(hand_made(), 2.0, SLO_500_80),
        summarize(one_token_only, 1.0),  # TPOT and ITL undefined (NaN)
    ]
    assert math.isnan(summaries[1].tpot.p[50])
    report = BenchReport(
        "ours",
        {"url": "http://x", "seed": 3},
        [
            RunSummary(
                {"type": "poisson", "rate": 1.0}, "poisson 1 req/s", 1.0, s, 0.001, f"r{i}.jsonl"
            )
            for i, s in enumerate(summaries)
        ],
    )
    path = tmp_path / "summary.json"
    write_report(path, report)
    assert "NaN" not in path.read_text()  # strict JSON: null, not NaN
    back = read_report(path)
    assert back.label == "ours" and back.meta == {"url": "http://x", "seed": 3}
    assert [summary_to_json(r.summary) for r in back.runs] == [
        summary_to_json(s) for s in summaries
    ]
    assert [r.records_file for r in back.runs] == ["r0.jsonl", "r1.jsonl"]


def test_records_round_trip(tmp_path):
    path = tmp_path / "records.jsonl"
    write_records(path, hand_made())
    assert read_records(path) == hand_made()


def test_not_a_summary_is_a_clear_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"label": "a"}')
    with pytest.raises(
        BenchError, match=r"x.json: not a benchmark summary \(missing or bad 'runs'\)"
    ):
        read_report(path)


def test_compare_shows_both_runs_and_ratios():
    base = summarize(hand_made(), duration_s=2.0, slo=SLO_500_80)
    faster = summarize(hand_made(), duration_s=1.0, slo=SLO_500_80)

    def report(label: str, s: object) -> BenchReport:
        return BenchReport(label, {}, [RunSummary({}, "burst", None, s, None, "r.jsonl")])  # type: ignore[arg-type]

    (table,) = compare_tables(report("static", base), report("continuous", faster))
    text = render(table)
    assert "continuous/static" in text
    throughput = next(line for line in text.splitlines() if "Output throughput" in line)
    assert "14.0" in throughput and "28.0" in throughput and "2.00x" in throughput
    ttft = next(line for line in text.splitlines() if "TTFT p50" in line)
    assert "1.00x" in ttft


def test_sweep_table_has_a_row_per_rate():
    runs = [
        RunSummary(
            {}, f"poisson {r:g} req/s", r, summarize(hand_made(), 2.0 / r, SLO_500_80), 0.0, "r"
        )
        for r in (1.0, 2.0)
    ]
    lines = render(sweep_table(runs)).splitlines()
    one = next(line for line in lines if "poisson 1 req/s" in line).split("│")
    two = next(line for line in lines if "poisson 2 req/s" in line).split("│")
    # Columns: load, req/s, tok/s, goodput req/s, good fraction, ...
    assert [c.strip() for c in one[2:6]] == ["2.000", "14.0", "1.000", "40.0%"]
    assert [c.strip() for c in two[2:6]] == ["4.000", "28.0", "2.000", "40.0%"]


@pytest.mark.parametrize(
    ("a", "b", "text"),
    [
        (2.0, 3.0, "1.50x"),
        (37.6, 0.1095, "0.0029x"),
        (1.0, 0.0, "0.00x"),
        (0.0, 1.0, "-"),
        (math.nan, 1.0, "-"),
        (1.0, math.nan, "-"),
    ],
)
def test_ratio_text(a, b, text):
    assert ratio_text(a, b) == text
