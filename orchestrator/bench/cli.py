"""``orchestrator bench``: measure an OpenAI-compatible server, or compare two runs.

Heavy modules (httpx, rich, pydantic models, matplotlib) are imported inside ``run`` so
that ``orchestrator --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.bench.bench_requests import BenchRequest
    from orchestrator.bench.client import StreamClient
    from orchestrator.bench.load import LoadShape
    from orchestrator.bench.results import BenchReport
    from orchestrator.bench.runner import RunResult
    from orchestrator.bench.tokenizer import ModelTokenizer

DEFAULT_NUM_REQUESTS = 100
# Above this p99 lag behind the send schedule, the client rather than the server set
# the pace of an open-loop run, and the offered load was lower than asked.
SEND_LAG_WARN_S = 0.05


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure TTFT, TPOT, throughput and goodput of an OpenAI-compatible server",
        description=(
            "Send a workload to an OpenAI-compatible server (ours, vLLM, trtllm-serve, "
            "llama.cpp, TGI) under a load shape and report TTFT, TPOT, ITL, E2E, "
            "throughput and goodput; or compare two runs with --compare."
        ),
    )
    server = p.add_argument_group("server")
    server.add_argument("--url", help="base URL, e.g. http://127.0.0.1:8000")
    server.add_argument(
        "--api",
        choices=("completions", "chat"),
        default="completions",
        help="/v1/completions or /v1/chat/completions (default completions)",
    )
    server.add_argument("--model", help="model name to request (default: the first served)")
    server.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="bearer token (default: $OPENAI_API_KEY)",
    )
    server.add_argument(
        "--request-timeout-s",
        type=float,
        default=300.0,
        help="longest silence allowed while reading a response (default 300)",
    )

    work = p.add_argument_group("workload")
    work.add_argument(
        "--workload",
        type=Path,
        help="JSONL of requests (a saved workload.jsonl, or lines with 'prompt' and "
        "optional 'max_tokens'); default: synthetic prompts from real text",
    )
    work.add_argument(
        "--num-requests",
        type=int,
        help=f"requests to send (default {DEFAULT_NUM_REQUESTS}; with --workload: all)",
    )
    work.add_argument(
        "--input-len",
        default="256",
        help="prompt tokens: N, uniform:LO:HI, lognormal:MED:SIGMA[:MAX] (default 256)",
    )
    work.add_argument(
        "--output-len",
        default="128",
        help="output tokens (max_tokens), same forms (default 128)",
    )
    work.add_argument("--seed", type=int, default=0, help="seed of prompts, lengths, arrivals")
    work.add_argument(
        "--tokenizer",
        default="embedded:smollm2-135m-instruct",
        help="tokenizer for synthetic prompts and for counting output when the server "
        "sends no usage: embedded:NAME or a local model folder (loaded only if needed)",
    )
    work.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="do not send the ignore_eos extension (outputs may stop before max_tokens)",
    )

    load = p.add_argument_group("load")
    load.add_argument(
        "--load",
        choices=("poisson", "gamma", "concurrency", "burst"),
        default="poisson",
        help="when requests are sent (default poisson)",
    )
    load.add_argument(
        "--rate", type=float, default=1.0, help="requests/s for poisson, gamma (default 1)"
    )
    load.add_argument(
        "--cv",
        type=float,
        default=2.0,
        help="gamma: the gaps' coefficient of variation, >1 is bursty (default 2)",
    )
    load.add_argument("--concurrency", type=int, default=8, help="closed-loop clients (default 8)")
    load.add_argument(
        "--think-time-s",
        type=float,
        default=0.0,
        help="closed loop: a client's pause between requests, seconds (default 0)",
    )
    load.add_argument(
        "--sweep-rates",
        type=_rates,
        help="comma-separated rates (req/s): one poisson/gamma run per rate",
    )

    out = p.add_argument_group("results")
    out.add_argument("--slo-ttft-ms", type=float, help="goodput bound on TTFT (ms)")
    out.add_argument("--slo-tpot-ms", type=float, help="goodput bound on TPOT (ms)")
    out.add_argument(
        "--result-dir",
        type=Path,
        help="where to write workload.jsonl, records and summary.json "
        "(default bench-results/<date-time>)",
    )
    out.add_argument("--label", help="name of this run in tables (default: HOST:PORT)")
    out.add_argument("--plot", type=Path, metavar="DIR", help="write PNG plots into DIR")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A.json", "B.json"),
        help="print two summary.json files side by side with ratios B/A, and exit",
    )
    p.set_defaults(func=run)


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected rates like 1,2,4") from None
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"{text!r}: rates must be positive req/s")
    return rates


def run(args: argparse.Namespace) -> int:
    """Exit code: 0 when at least one request completed (or a comparison printed), 1
    when none did, 2 for bad input or an unusable server, 130 when interrupted."""
    from orchestrator.bench.errors import BenchError

    try:
        if args.compare:
            return _compare(args.compare[0], args.compare[1])
        return _bench(args)
    except BenchError as err:
        print(f"orchestrator bench: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("orchestrator bench: interrupted before the results were written", file=sys.stderr)
        return 130


def _compare(path_a: Path, path_b: Path) -> int:
    from orchestrator.bench.errors import BenchError
    from orchestrator.bench.report import compare_tables
    from orchestrator.bench.results import read_report

    a, b = read_report(path_a), read_report(path_b)
    if len(a.runs) != len(b.runs):
        raise BenchError(
            f"{path_a} has {len(a.runs)} runs and {path_b} has {len(b.runs)}; "
            "compare runs of the same shape (or the same sweep)"
        )
    console = _console()
    for table in compare_tables(a, b):
        console.print(table)
    return 0


def _bench(args: argparse.Namespace) -> int:
    import asyncio
    import datetime

    from orchestrator.bench.bench_requests import write_workload
    from orchestrator.bench.client import normalize_base_url
    from orchestrator.bench.errors import BenchError
    from orchestrator.bench.results import BenchReport, write_records, write_report
    from orchestrator.bench.runner import summarize_run
    from orchestrator.bench.tokenizer import ModelTokenizer
    from orchestrator.common.metrics import SLO

    if not args.url:
        raise BenchError("--url is required (or --compare A.json B.json)")
    base_url = normalize_base_url(args.url)
    shapes = _shapes(args)
    slo = SLO(
        ttft_s=_seconds(args.slo_ttft_ms, "--slo-ttft-ms"),
        tpot_s=_seconds(args.slo_tpot_ms, "--slo-tpot-ms"),
    )
    tokenizer = ModelTokenizer(args.tokenizer)
    requests = _workload(args, tokenizer)
    stamp = datetime.datetime.now().astimezone()
    result_dir: Path = args.result_dir or Path("bench-results") / stamp.strftime("%Y%m%d-%H%M%S")
    result_dir.mkdir(parents=True, exist_ok=True)
    write_workload(result_dir / "workload.jsonl", requests)

    client = _client(args, requests, shapes)
    runs = asyncio.run(_measure(client, requests, shapes, args.seed, not args.no_progress))

    summaries, record_sets = [], []
    for i, run_result in enumerate(runs):
        name = "records.jsonl" if len(runs) == 1 else f"records-run{i}.jsonl"
        summary, records = summarize_run(run_result, requests, tokenizer, slo, name)
        write_records(result_dir / name, records)
        summaries.append(summary)
        record_sets.append((summary.description, records))
    meta = {
        "url": base_url,
        "api": args.api,
        "model": client.model,
        "ignore_eos": client.ignore_eos,
        "seed": args.seed,
        "num_requests": len(requests),
        "mean_prompt_tokens": sum(r.num_prompt_tokens for r in requests) / len(requests),
        "mean_max_tokens": sum(r.max_tokens for r in requests) / len(requests),
        "workload_file": "workload.jsonl",
        "created": stamp.isoformat(timespec="seconds"),
    }
    label = args.label or base_url.split("://", 1)[1]
    report = BenchReport(label, meta, summaries)
    write_report(result_dir / "summary.json", report)
    _print_report(report, len(requests))

    err_console = _console(stderr=True)
    if args.plot is not None:
        from orchestrator.bench.plots import plot_cdfs, plot_sweep

        for path in plot_cdfs(record_sets, args.plot) + plot_sweep(summaries, args.plot):
            err_console.print(f"plot: {path}", markup=False, soft_wrap=True)
    err_console.print(
        f"results: {result_dir}/ (summary.json, records, workload.jsonl to replay)",
        markup=False,
        soft_wrap=True,
    )
    if not any(s.summary.num_completed for s in summaries):
        err_console.print("no request completed", markup=False)
        return 1
    return 0


def _print_report(report: BenchReport, num_requests: int) -> None:
    """One run as latency and totals tables, several as a sweep table; then a warning
    for every open-loop run the client could not send on schedule."""
    from rich.text import Text

    from orchestrator.bench.client import Api
    from orchestrator.bench.report import latency_table, sweep_table, totals_table

    console, err_console = _console(), _console(stderr=True)
    meta = report.meta
    header = f"{report.label} {Api(meta['api']).path} ({meta['model']}), {num_requests} requests"
    if len(report.runs) == 1:
        (run,) = report.runs
        console.print(Text(f"{header}, {run.description}", style="bold"), soft_wrap=True)
        console.print(latency_table(run.summary))
        console.print(totals_table(run.summary))
    else:
        console.print(Text(header, style="bold"), soft_wrap=True)
        console.print(sweep_table(report.runs))
    for run in report.runs:
        if run.retries:
            err_console.print(
                f"note: {run.description}: {run.retries} request(s) sent again on a fresh "
                "connection after the server closed a kept-alive one before answering",
                markup=False,
            )
        lag = run.send_lag_p99_s
        if lag is not None and lag > SEND_LAG_WARN_S:
            err_console.print(
                f"warning: {run.description}: requests left up to {lag * 1000:.0f} ms (p99) "
                "behind schedule; the offered load was lower than asked",
                markup=False,
            )


def _console(stderr: bool = False) -> Console:
    """A rich console; 160 columns when not a terminal (a log or a pipe), where rich
    would otherwise wrap wide tables at 80."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


def _shapes(args: argparse.Namespace) -> list[LoadShape]:
    from pydantic import ValidationError

    from orchestrator.bench.errors import BenchError
    from orchestrator.bench.load import BurstArrivals
    from orchestrator.common.workloads import ClosedLoop, GammaArrivals, PoissonArrivals
    from orchestrator.core import format_errors

    rates: list[float] = args.sweep_rates or [args.rate]
    if args.sweep_rates and args.load not in ("poisson", "gamma"):
        raise BenchError(f"--sweep-rates needs --load poisson or gamma, not {args.load}")
    try:
        if args.load == "poisson":
            return [PoissonArrivals(rate=r) for r in rates]
        if args.load == "gamma":
            return [GammaArrivals(rate=r, cv=args.cv) for r in rates]
        if args.load == "concurrency":
            return [ClosedLoop(concurrency=args.concurrency, think_time_s=args.think_time_s)]
        return [BurstArrivals()]
    except ValidationError as err:
        raise BenchError(f"--load {args.load}: {format_errors(err)}") from None


def _seconds(ms: float | None, flag: str) -> float | None:
    from orchestrator.bench.errors import BenchError

    if ms is None:
        return None
    if ms <= 0:
        raise BenchError(f"{flag} must be positive, got {ms:g}")
    return ms / 1000.0


def _workload(args: argparse.Namespace, tokenizer: ModelTokenizer) -> list[BenchRequest]:
    from orchestrator.bench.bench_requests import parse_length, read_workload, synthetic_workload
    from orchestrator.bench.errors import BenchError

    if args.num_requests is not None and args.num_requests < 1:
        raise BenchError(f"--num-requests must be at least 1, got {args.num_requests}")
    output_len = parse_length(args.output_len)
    if args.workload is not None:
        requests = read_workload(args.workload, tokenizer, output_len, args.seed)
        return requests[: args.num_requests] if args.num_requests else requests
    return synthetic_workload(
        tokenizer,
        args.num_requests or DEFAULT_NUM_REQUESTS,
        parse_length(args.input_len),
        output_len,
        args.seed,
    )


def _client(
    args: argparse.Namespace, requests: list[BenchRequest], shapes: list[LoadShape]
) -> StreamClient:
    from orchestrator.bench.client import Api, StreamClient
    from orchestrator.bench.load import max_in_flight

    return StreamClient(
        args.url,
        Api(args.api),
        args.model,
        api_key=args.api_key,
        ignore_eos=not args.no_ignore_eos,
        max_connections=max(max_in_flight(s, len(requests)) for s in shapes),
        timeout_s=args.request_timeout_s,
    )


async def _measure(
    client: StreamClient,
    requests: list[BenchRequest],
    shapes: list[LoadShape],
    seed: int,
    show_progress: bool,
) -> list[RunResult]:
    """Check the server, then run every shape in turn on one connection pool."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    from orchestrator.bench.client import StreamResult
    from orchestrator.bench.load import describe
    from orchestrator.bench.runner import run_load

    err_console = _console(stderr=True)
    async with client:
        for note in await client.prepare():
            err_console.print(f"note: {note}", markup=False)
        runs = []
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            console=err_console,
            disable=not show_progress,
        )
        with progress:
            for shape in shapes:
                task = progress.add_task(describe(shape), total=len(requests), failed=0)
                failed = 0

                def on_result(result: StreamResult, task: TaskID = task) -> None:
                    nonlocal failed
                    failed += result.error is not None
                    progress.update(task, advance=1, failed=failed)

                runs.append(await run_load(client, requests, shape, seed, on_result))
        return runs
