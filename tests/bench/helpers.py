"""Small builders shared by the benchmark-client tests."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from orchestrator.bench.bench_requests import BenchRequest
from orchestrator.bench.cli import register
from orchestrator.bench.client import Api, StreamClient
from orchestrator.bench.load import LoadShape
from orchestrator.bench.runner import RunResult, run_load, to_records
from orchestrator.bench.tokenizer import TextTokenizer
from orchestrator.common.metrics import RequestRecord


def make_requests(n: int, max_tokens: int = 8, prompt: str = "one two three") -> list[BenchRequest]:
    return [BenchRequest(f"req-{i:06d}", prompt, len(prompt.split()), max_tokens) for i in range(n)]


def run(
    url: str,
    requests: Sequence[BenchRequest],
    shape: LoadShape,
    *,
    api: Api = Api.COMPLETIONS,
    ignore_eos: bool = True,
    seed: int = 0,
) -> RunResult:
    """One run against ``url`` without the pre-flight probe (model name given)."""

    async def go() -> RunResult:
        async with StreamClient(
            url, api, "test-model", ignore_eos=ignore_eos, max_connections=len(requests)
        ) as client:
            return await run_load(client, requests, shape, seed)

    return asyncio.run(go())


def records(
    url: str,
    requests: Sequence[BenchRequest],
    shape: LoadShape,
    tokenizer: TextTokenizer,
    *,
    api: Api = Api.COMPLETIONS,
    ignore_eos: bool = True,
) -> tuple[RunResult, list[RequestRecord]]:
    result = run(url, requests, shape, api=api, ignore_eos=ignore_eos)
    return result, to_records(result, requests, tokenizer)


class UnusableTokenizer:
    """Fails if used: proves a code path never needed a tokenizer."""

    def encode(self, text: str) -> list[int]:
        raise AssertionError("the tokenizer was used")

    def decode(self, ids: Sequence[int]) -> str:
        raise AssertionError("the tokenizer was used")


def bench(*argv: str) -> int:
    """Run ``orchestrator bench ARGV``; returns its exit code."""
    parser = argparse.ArgumentParser(prog="orchestrator")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *argv])
    code: int = args.func(args)
    return code


def write_prompts(path: Path, n: int) -> None:
    """``n`` prompts of 5 words, each asking for 6 tokens."""
    rows = [
        {"prompt": f"word {i} of the prompt", "num_prompt_tokens": 5, "max_tokens": 6}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
