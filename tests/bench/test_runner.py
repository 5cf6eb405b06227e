"""Load shapes driven against the local SSE server: the client opens as many streams as
the shape asks, keeps its timing under many concurrent streams, reuses connections,
follows the open-loop schedule, and accounts for every request."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.bench.load import BurstArrivals, send_offsets
from orchestrator.common.metrics import percentile, summarize
from orchestrator.common.workloads import ClosedLoop, PoissonArrivals
from tests.bench.helpers import UnusableTokenizer, make_requests, records

STREAMS = 64


def test_burst_opens_every_stream_at_once_against_an_instant_server(sse_server):
    # The server holds the first token until all streams are open: a client that
    # serialised requests or had too small a pool would leave it short.
    server = sse_server(hold_until=STREAMS)
    _, recs = records(
        server.url, make_requests(STREAMS, max_tokens=64), BurstArrivals(), UnusableTokenizer()
    )
    assert server.state.peak_streams == STREAMS
    assert all(r.ok for r in recs)
    assert all(len(r.token_times) == 64 and r.num_output_tokens == 64 for r in recs)


def test_timing_holds_under_many_concurrent_streams(sse_server):
    itl_s = 0.05
    server = sse_server(itl_s=itl_s, hold_until=STREAMS)
    _, recs = records(
        server.url, make_requests(STREAMS, max_tokens=20), BurstArrivals(), UnusableTokenizer()
    )
    s = summarize(recs, duration_s=1.0)
    assert s.num_completed == STREAMS
    # Wide enough for two busy shared cores; a client that could not keep up with
    # 1,280 chunks/s would stretch the gaps far more.
    assert itl_s - 0.002 <= s.itl.p[50] <= itl_s * 1.4, s.itl
    assert itl_s - 0.002 <= s.tpot.p[50] <= itl_s * 1.4, s.tpot


def test_closed_loop_bounds_concurrency_and_reuses_connections(sse_server):
    server = sse_server(itl_s=0.002)
    run, recs = records(
        server.url, make_requests(20, max_tokens=4), ClosedLoop(concurrency=4), UnusableTokenizer()
    )
    assert all(r.ok for r in recs)
    assert server.state.peak_streams <= 4
    assert server.state.connections <= 4  # keep-alive: 20 requests over at most 4 sockets
    assert run.send_lags_s == []


def test_closed_loop_think_time_spaces_a_clients_requests(sse_server):
    server = sse_server()
    _, recs = records(
        server.url,
        make_requests(3, max_tokens=2),
        ClosedLoop(concurrency=1, think_time_s=0.1),
        UnusableTokenizer(),
    )
    for before, after in itertools.pairwise(recs):
        assert after.arrival_time - before.e2e - before.arrival_time >= 0.1 - 0.002


def test_open_loop_follows_the_seeded_schedule(sse_server):
    shape = PoissonArrivals(rate=20.0)
    server = sse_server()
    run, recs = records(server.url, make_requests(15, max_tokens=2), shape, UnusableTokenizer())
    offsets = send_offsets(shape, 15, seed=0)
    lags = [r.arrival_time - o for r, o in zip(recs, offsets, strict=True)]
    assert min(lags) >= -0.001  # never sent early
    assert percentile(lags, 50) < 0.05
    assert run.send_lags_s == pytest.approx(lags, abs=1e-9)


def test_every_request_is_accounted_for_when_some_fail(sse_server):
    server = sse_server(error_status=503, fail_every=3)
    run, recs = records(server.url, make_requests(12), BurstArrivals(), UnusableTokenizer())
    assert [r.request_id for r in recs] == [f"req-{i:06d}" for i in range(12)]
    assert sum(not r.ok for r in recs) == 4
    assert summarize(recs, run.duration_s).errors_by_status == {"503": 4}


def test_records_are_timed_from_the_start_of_the_run(sse_server):
    server = sse_server(ttft_s=0.05)
    run, recs = records(server.url, make_requests(3), BurstArrivals(), UnusableTokenizer())
    # perf_counter values would be the machine's uptime, not a fraction of a second.
    assert all(0 <= r.arrival_time < 1.0 for r in recs)
    assert max(r.e2e + r.arrival_time for r in recs) == pytest.approx(run.duration_s, abs=0.1)
