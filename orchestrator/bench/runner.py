"""Drive a workload through a load shape, and turn what the client saw into the shared
``RequestRecord``s that ``orchestrator.common.metrics`` summarises."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from orchestrator.bench.bench_requests import BenchRequest
from orchestrator.bench.client import StreamClient, StreamResult
from orchestrator.bench.load import LoadShape, describe, rate_of, send_offsets
from orchestrator.bench.results import RunSummary
from orchestrator.bench.tokenizer import TextTokenizer
from orchestrator.common.metrics import SLO, RequestRecord, percentile, summarize
from orchestrator.common.workloads import ClosedLoop


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run of a workload under one load shape.

    ``results`` are in workload order. ``start_time`` (``perf_counter`` seconds) is time
    0 of the send schedule; ``duration_s`` runs from it to the end of the last
    response. ``send_lags_s`` says how late each open-loop request left against its
    schedule (seconds; empty for a closed loop): large lags mean the client, not the
    server, set the pace.
    """

    shape: LoadShape
    results: list[StreamResult]
    start_time: float
    duration_s: float
    send_lags_s: list[float]


async def run_load(
    client: StreamClient,
    requests: Sequence[BenchRequest],
    shape: LoadShape,
    seed: int,
    on_result: Callable[[StreamResult], None] | None = None,
) -> RunResult:
    """Send every request of ``requests`` as ``shape`` says and wait for all of them.

    ``on_result`` is called as each request ends (for a progress bar). Open-loop send
    times come from ``send_offsets(shape, len(requests), seed)``.
    """

    async def one(request: BenchRequest) -> StreamResult:
        result = await client.stream(request)
        if on_result is not None:
            on_result(result)
        return result

    start = time.perf_counter()
    if isinstance(shape, ClosedLoop):
        results = await _closed_loop(one, requests, shape)
        lags: list[float] = []
    else:
        offsets = send_offsets(shape, len(requests), seed)
        tasks = []
        for offset, request in zip(offsets, requests, strict=True):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(request)))
        results = list(await asyncio.gather(*tasks))
        lags = [r.send_time - (start + o) for r, o in zip(results, offsets, strict=True)]
    end = max(r.end_time for r in results)
    return RunResult(shape, results, start, end - start, lags)


async def _closed_loop(
    one: Callable[[BenchRequest], Awaitable[StreamResult]],
    requests: Sequence[BenchRequest],
    shape: ClosedLoop,
) -> list[StreamResult]:
    done: dict[int, StreamResult] = {}
    # One shared iterator: each client takes the next unsent request when it is free.
    queue = iter(enumerate(requests))

    async def client_loop() -> None:
        for i, request in queue:
            done[i] = await one(request)
            if shape.think_time_s > 0:
                await asyncio.sleep(shape.think_time_s)

    await asyncio.gather(*(client_loop() for _ in range(min(shape.concurrency, len(requests)))))
    return [done[i] for i in range(len(requests))]


def to_records(
    run: RunResult, requests: Sequence[BenchRequest], tokenizer: TextTokenizer
) -> list[RequestRecord]:
    """One ``RequestRecord`` per request, times in seconds since the run started.

    Output tokens come from the server's ``usage``; when a completed request has none,
    its text is counted with ``tokenizer`` (loaded only then). A failed request keeps
    the usage it got, else 0 tokens: metrics count it as an error either way. Prompt
    tokens come from ``usage`` when given, else from the workload.
    """
    prompt_tokens = {r.request_id: r.num_prompt_tokens for r in requests}
    records = []
    for res in run.results:
        if res.completion_tokens is not None:
            num_output = res.completion_tokens
        elif res.error is None:
            num_output = len(tokenizer.encode(res.text))
        else:
            num_output = 0
        records.append(
            RequestRecord(
                request_id=res.request_id,
                arrival_time=res.send_time - run.start_time,
                token_times=tuple(t - run.start_time for t in res.chunk_times),
                num_prompt_tokens=(
                    res.prompt_tokens
                    if res.prompt_tokens is not None
                    else prompt_tokens[res.request_id]
                ),
                num_output_tokens=num_output,
                error=res.error,
                status_code=res.status_code,
            )
        )
    return records


def summarize_run(
    run: RunResult,
    requests: Sequence[BenchRequest],
    tokenizer: TextTokenizer,
    slo: SLO,
    records_file: str,
) -> tuple[RunSummary, list[RequestRecord]]:
    """The run's records (see ``to_records``) and their summary under ``slo``, over the
    run's duration; ``records_file`` is where the caller writes the records."""
    records = to_records(run, requests, tokenizer)
    summary = RunSummary(
        load=run.shape.model_dump(),
        description=describe(run.shape),
        rate=rate_of(run.shape),
        summary=summarize(records, run.duration_s, slo),
        send_lag_p99_s=percentile(run.send_lags_s, 99) if run.send_lags_s else None,
        records_file=records_file,
        retries=sum(r.retries for r in run.results),
    )
    return summary, records
