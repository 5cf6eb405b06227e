"""The benchmark client with the real model: synthetic prompts cut with the embedded
tokenizer, and a run against our own gateway serving the default model."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.bench.bench_requests import synthetic_workload
from orchestrator.bench.errors import BenchError
from orchestrator.bench.results import read_records, read_report
from orchestrator.bench.tokenizer import ModelTokenizer
from orchestrator.common.workloads import FixedLength, UniformLength, WorkloadConfig, build_workload
from tests.bench.helpers import bench

SERVE_CONFIG = Path(__file__).parents[2] / "configs/serve/smollm2-cpu.yaml"
# Starts `orchestrator serve` through the gateway's own `register`, the seam every
# sub-command module exposes, so the test does not depend on the command table.
SERVE = (
    "import argparse, sys\n"
    "from orchestrator.gateway.cli import register\n"
    "parser = argparse.ArgumentParser(prog='orchestrator')\n"
    "register(parser.add_subparsers())\n"
    "args = parser.parse_args(sys.argv[1:])\n"
    "sys.exit(args.func(args))\n"
)


def test_unknown_tokenizer_is_a_clear_error():
    tokenizer = ModelTokenizer("embedded:no-such-model")
    with pytest.raises(BenchError, match="cannot load tokenizer 'embedded:no-such-model'"):
        tokenizer.encode("x")


@pytest.mark.slow
def test_synthetic_prompts_with_the_embedded_tokenizer():
    tokenizer = ModelTokenizer("embedded:smollm2-135m-instruct")
    assert not tokenizer.loaded
    lengths = UniformLength(low=16, high=256)
    requests = synthetic_workload(tokenizer, 20, lengths, FixedLength(value=8), seed=0)
    assert tokenizer.loaded
    drawn = [
        s.prompt_len
        for s in build_workload(
            WorkloadConfig(num_requests=20, prompt_len=lengths, seed=0)
        ).requests
    ]
    for request, n in zip(requests, drawn, strict=True):
        assert request.num_prompt_tokens == len(tokenizer.encode(request.prompt))
        # A window of ids decoded to text re-encodes to about the same count: BPE may
        # merge differently at the window's edges only.
        assert abs(request.num_prompt_tokens - n) <= 2, (request.num_prompt_tokens, n)


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory):
    pytest.importorskip("orchestrator.gateway.cli")
    if not SERVE_CONFIG.exists():
        pytest.skip(f"{SERVE_CONFIG} is missing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("gateway") / "serve.log"
    argv = ["serve", "--config", str(SERVE_CONFIG), "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", SERVE, *argv], stdout=err, stderr=err)
        try:
            _wait_ready(proc, url, log)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the gateway exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail("the gateway was not ready within 300 s")


@pytest.mark.slow
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_bench_against_our_gateway(gateway_url, tmp_path, api):
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": f"Write a short note about the number {i}.", "max_tokens": 8} for i in range(4)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    code = bench(
        "--url", gateway_url, "--api", api, "--workload", str(prompts),
        "--load", "concurrency", "--concurrency", "2",
        # Missing prompt lengths are counted with the tokenizer: the embedded one.
        "--result-dir", str(out), "--no-progress",
    )  # fmt: skip
    assert code == 0
    report = read_report(out / "summary.json")
    assert report.meta["ignore_eos"] is True  # the gateway accepts the extension
    (run,) = report.runs
    assert run.summary.num_completed == 4
    records = read_records(out / "records.jsonl")
    # ignore_eos runs every output to max_tokens; usage reports the server's counts.
    assert [r.num_output_tokens for r in records] == [8, 8, 8, 8]
    assert all(r.num_prompt_tokens > 0 and r.ttft is not None and r.ttft > 0 for r in records)
