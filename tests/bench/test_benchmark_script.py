"""``benchmarks/serve_continuous_vs_static.sh`` end to end, with a stand-in ``serve``
(the SSE test server, slower in static mode) and the real ``bench``."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "benchmarks/serve_continuous_vs_static.sh"


def stand_in(tmp_path: Path) -> Path:
    exe = tmp_path / "orchestrator"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.bench.fake_orchestrator "$@"\n')
    exe.chmod(0o755)
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "serve.yaml"
    config.write_text("model:\n  name: SmolLM2-135M-Instruct\nscheduler:\n  batching: continuous\n")
    full_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHON": sys.executable,
        "ORCHESTRATOR": str(stand_in(tmp_path)),
        "CONFIG": str(config),
        "PORT": str(free_port()),
        "OUT": str(tmp_path / "out"),
        "NUM_REQUESTS": "6",
        "RATE": "20",
        "INPUT_LEN": "8",
        "OUTPUT_LEN": "12",
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], env=full_env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_script_compares_both_modes_on_one_workload(tmp_path):
    # Synthetic prompts need a tokenizer: the embedded one, as in real use.
    done = run_script(tmp_path)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(
        r"served continuous/static: throughput ([\d.]+)x, p99 TTFT ([\d.]+)x", last
    )
    assert match, last
    out = tmp_path / "out"
    static_config = (out / "serve-static.yaml").read_text()
    assert "batching: static" in static_config and "name: SmolLM2-135M-Instruct" in static_config
    summaries = [
        json.loads((out / m / "summary.json").read_text()) for m in ("continuous", "static")
    ]
    assert [s["runs"][0]["summary"]["num_completed"] for s in summaries] == [6, 6]
    assert [(s["label"], s["model"]) for s in summaries] == [
        ("continuous", "stand-in-continuous"),
        ("static", "stand-in-static"),
    ]
    # The static run replayed the continuous run's workload.
    assert (out / "static/workload.jsonl").read_text() == (
        out / "continuous/workload.jsonl"
    ).read_text()
    assert "continuous/static" in done.stdout


def test_script_fails_clearly_without_the_gateway(tmp_path):
    done = run_script(tmp_path, ORCHESTRATOR="/bin/false")
    assert done.returncode == 2
    assert "needs the gateway (orchestrator serve)" in done.stderr
