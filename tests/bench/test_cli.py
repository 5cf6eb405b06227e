"""``orchestrator bench`` end to end against the local SSE server: result files, plots,
sweeps, comparisons and exit codes."""

from __future__ import annotations

import json
import socket

from orchestrator.bench.results import read_records, read_report
from tests.bench.helpers import bench, write_prompts


def test_bench_writes_records_summary_workload_and_plots(tmp_path, sse_server, capsys):
    server = sse_server(ttft_s=0.05, itl_s=0.01)
    prompts, out, plots = tmp_path / "prompts.jsonl", tmp_path / "out", tmp_path / "plots"
    write_prompts(prompts, 10)
    code = bench(
        "--url", server.url + "/v1",
        "--workload", str(prompts),
        "--load", "concurrency", "--concurrency", "4",
        # Never loaded: the workload has prompt lengths and the server sends usage.
        "--tokenizer", str(tmp_path / "no-such-model"),
        "--slo-ttft-ms", "500", "--slo-tpot-ms", "80",
        "--result-dir", str(out), "--plot", str(plots), "--label", "test", "--no-progress",
    )  # fmt: skip
    assert code == 0
    report = read_report(out / "summary.json")
    assert report.label == "test"
    assert report.meta["model"] == "test-model" and report.meta["ignore_eos"] is True
    (run,) = report.runs
    assert run.description == "concurrency 4"
    assert (run.summary.num_completed, run.summary.output_tokens) == (10, 60)
    assert run.summary.goodput_fraction == 1.0
    assert len(read_records(out / run.records_file)) == 10
    saved = [json.loads(line) for line in (out / "workload.jsonl").read_text().splitlines()]
    given = [json.loads(line) for line in prompts.read_text().splitlines()]
    assert [(s["prompt"], s["max_tokens"]) for s in saved] == [
        (g["prompt"], g["max_tokens"]) for g in given
    ]
    assert sorted(p.name for p in plots.iterdir()) == ["tpot_cdf.png", "ttft_cdf.png"]
    stdout = capsys.readouterr().out
    assert "TTFT" in stdout and "Goodput (TTFT ≤ 500 ms, TPOT ≤ 80 ms)" in stdout


def test_sweep_runs_each_rate_and_plots_against_rate(tmp_path, sse_server, capsys):
    server = sse_server()
    prompts, out, plots = tmp_path / "prompts.jsonl", tmp_path / "out", tmp_path / "plots"
    write_prompts(prompts, 6)
    code = bench(
        "--url", server.url, "--workload", str(prompts), "--sweep-rates", "20,40",
        "--result-dir", str(out), "--plot", str(plots), "--no-progress",
    )  # fmt: skip
    assert code == 0
    report = read_report(out / "summary.json")
    assert [r.rate for r in report.runs] == [20.0, 40.0]
    assert [r.records_file for r in report.runs] == ["records-run0.jsonl", "records-run1.jsonl"]
    assert all(r.summary.num_completed == 6 for r in report.runs)
    assert {"goodput_vs_rate.png", "p99_ttft_vs_rate.png"} <= {p.name for p in plots.iterdir()}
    # 6 requests per rate plus the probe.
    assert len(server.state.bodies) == 13
    assert "poisson 20 req/s" in capsys.readouterr().out


def test_compare_prints_two_runs_with_ratios(tmp_path, sse_server, capsys):
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 4)
    for label, itl in (("slow", 0.02), ("fast", 0.01)):
        server = sse_server(itl_s=itl)
        args = ["--url", server.url, "--workload", str(prompts), "--load", "burst"]
        assert (
            bench(*args, "--label", label, "--result-dir", str(tmp_path / label), "--no-progress")
            == 0
        )
    capsys.readouterr()
    assert (
        bench("--compare", str(tmp_path / "slow/summary.json"), str(tmp_path / "fast/summary.json"))
        == 0
    )
    out = capsys.readouterr().out
    assert "fast/slow" in out and "Output throughput" in out
    tpot = next(line for line in out.splitlines() if "TPOT p50" in line)
    ratio = float(tpot.split("│")[-2].strip().removesuffix("x"))
    assert 0.3 < ratio < 0.85  # half the injected gap, give or take scheduling


def test_unreachable_server_exits_2_with_a_clear_message(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 2)
    code = bench(
        "--url",
        f"http://127.0.0.1:{port}",
        "--workload",
        str(prompts),
        "--result-dir",
        str(tmp_path / "o"),
    )
    assert code == 2
    assert f"error: cannot reach http://127.0.0.1:{port}" in capsys.readouterr().err


def test_all_requests_failing_exits_1_and_still_writes_results(tmp_path, sse_server, capsys):
    server = sse_server(error_status=503, spare_first=1)  # the probe passes, then all fail
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out"
    write_prompts(prompts, 3)
    code = bench(
        "--url",
        server.url,
        "--workload",
        str(prompts),
        "--load",
        "burst",
        "--result-dir",
        str(out),
        "--no-progress",
    )
    assert code == 1
    assert "no request completed" in capsys.readouterr().err
    (run,) = read_report(out / "summary.json").runs
    assert (run.summary.num_requests, run.summary.errors_by_status) == (3, {"503": 3})


def test_a_failing_probe_stops_before_measuring(tmp_path, sse_server, capsys):
    server = sse_server(error_status=503)
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 3)
    code = bench(
        "--url", server.url, "--workload", str(prompts), "--result-dir", str(tmp_path / "o")
    )
    assert code == 2
    assert "probe request to" in capsys.readouterr().err
    assert len(server.state.bodies) == 1


def test_bad_options_exit_2_naming_the_option(tmp_path, capsys):
    assert bench("--url", "http://127.0.0.1:1", "--load", "burst", "--sweep-rates", "1,2") == 2
    assert "--sweep-rates needs --load poisson or gamma, not burst" in capsys.readouterr().err
    assert bench("--url", "http://127.0.0.1:1", "--rate", "0") == 2
    assert "--load poisson: rate: Input should be greater than 0" in capsys.readouterr().err
    assert bench("--url", "http://127.0.0.1:1", "--output-len", "uniform:9:1") == 2
    assert "length 'uniform:9:1'" in capsys.readouterr().err
    assert bench("--load", "burst") == 2
    assert "--url is required" in capsys.readouterr().err
