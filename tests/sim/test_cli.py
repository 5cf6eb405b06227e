"""``orchestrator simulate | tune | plan | calibrate`` through their parsers."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from orchestrator.core.config import load_engine_config
from orchestrator.sim import cli
from orchestrator.sim.config import load_sim_config

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "configs" / "sim" / "llama3-70b-fp8-h100-tp2.yaml"


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    code: int = args.func(args)
    return code


@pytest.fixture
def small_config(tmp_path: Path) -> Path:
    """The shipped config with Llama-3-8B on one H100 and short requests: quick to run."""
    data = yaml.safe_load(SHIPPED.read_text())
    data["engine"]["executor"].update(model="llama3-8b", weight_dtype="bf16", tp=1)
    data["workload"].update(
        num_requests=60,
        prompt_len={"type": "uniform", "low": 50, "high": 400},
        output_len={"type": "uniform", "low": 10, "high": 60},
    )
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_shipped_config_loads_and_names_the_flagship_deployment() -> None:
    config = load_sim_config(SHIPPED)
    options = config.engine.executor.options
    assert (options.model, options.hardware, options.weight_dtype, options.tp) == (
        "llama3-70b",
        "h100-sxm",
        "fp8",
        2,
    )


def test_simulate_prints_the_tables(small_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("simulate", "--config", str(small_config), "--rate", "5", "--replicas", "2") == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "goodput req/s" in out
    assert "2 x 1" in out  # replicas x GPUs


def test_simulate_writes_three_plots(small_config: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "plots"
    argv = ["simulate", "--config", str(small_config), "--plot", str(out_dir)]
    assert run_cli(*argv, "--sweep-points", "2", "--num-requests", "30") == 0
    pngs = sorted(p.name for p in out_dir.glob("*.png"))
    assert pngs == ["batch_occupancy.png", "goodput_vs_rate.png", "latency_cdf.png"]
    assert all((out_dir / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_a_bad_config_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: {executor: {type: sim, tp: 3}}\nworkload: {num_requets: 5}\n")
    assert run_cli("simulate", "--config", str(bad)) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "num_requets: unknown key" in err


def test_tune_writes_the_best_setting_as_an_engine_yaml(
    small_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tuned.yaml"
    argv = ["tune", "--config", str(small_config), "--rate", "20", "--output", str(out)]
    grid = [
        "--chunk-sizes",
        "128",
        "512",
        "--max-num-tokens",
        "2048",
        "--max-batch-sizes",
        "1",
        "64",
    ]
    assert run_cli(*argv, *grid, "--slo-ttft-ms", "300", "--slo-tpot-ms", "50") == 0
    tuned = load_engine_config(out)
    # One request at a time cannot keep up with 20 req/s; the best setting batches.
    assert tuned.scheduler.max_batch_size == 64
    assert tuned.executor.type == "sim" and tuned.executor.options.model == "llama3-8b"
    assert "best: chunk_size=" in capsys.readouterr().out


def test_tune_rejects_an_empty_grid(small_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "--config", str(small_config), "--chunk-sizes", "4096"]
    assert run_cli(*argv, "--max-num-tokens", "1024") == 2
    assert "no setting in the grid" in capsys.readouterr().err


def test_plan_prints_the_memory_plan_and_the_fewest_gpus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--model", "llama3-70b", "--hardware", "h100-sxm", "--dtype", "fp8"]
    args = [*argv, "--tp", "1", "2", "--rate", "4", "--slo-ttft-ms", "500", "--slo-tpot-ms", "80"]
    assert run_cli(*args, "--num-requests", "80", "--output-len", "64") == 0
    out = capsys.readouterr().out
    assert "KV memory plan" in out and "163,840" in out  # KV bytes/token/GPU at tp=1 (fp8)
    assert "fewest GPUs:" in out


def test_plan_explains_a_width_that_cannot_hold_the_weights(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--model", "llama3-70b", "--hardware", "h100-sxm", "--tp", "1", "2"]
    assert run_cli(*argv, "--rate", "1", "--slo-ttft-ms", "800", "--num-requests", "40") == 0
    out = capsys.readouterr().out
    assert "more than the 80 GB" in out


def test_plan_needs_an_slo_bound(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--rate", "1"]
    assert run_cli(*argv) == 2
    assert "--slo-ttft-ms" in capsys.readouterr().err


def test_calibrate_refuses_a_non_torch_executor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text("executor: {type: sim}\n")
    assert run_cli("calibrate", "--config", str(config), "--output-dir", str(tmp_path)) == 2
    assert "runs the torch executor" in capsys.readouterr().err


def test_the_main_entry_point_dispatches_to_the_simulator(
    small_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import orchestrator.cli

    monkeypatch.setattr(orchestrator.cli, "COMMAND_MODULES", ("orchestrator.sim.cli",))
    argv = ["simulate", "--config", str(small_config), "--num-requests", "10"]
    assert orchestrator.cli.main(argv) == 0
    assert "Latency (ms)" in capsys.readouterr().out


def test_plan_keeps_the_config_deployments_runtime_options(tmp_path: Path) -> None:
    from orchestrator.sim import commands

    data = yaml.safe_load(SHIPPED.read_text())
    data["engine"]["executor"].update(runtime_reserve_bytes=5_000_000_000, kv_memory_fraction=0.5)
    path = tmp_path / "reserve.yaml"
    path.write_text(yaml.safe_dump(data))
    parser = argparse.ArgumentParser(prog="orchestrator")
    cli.register(parser.add_subparsers(dest="command", required=True))
    argv = ["plan", "--config", str(path), "--model", "llama3-8b", "--hardware", "h100-sxm"]
    config = commands._plan_config(parser.parse_args([*argv, "--rate", "1", "--slo-ttft-ms", "9"]))
    options = config.engine.executor.options
    assert (options.model, options.weight_dtype, options.tp) == ("llama3-8b", "bf16", 1)
    assert (options.runtime_reserve_bytes, options.kv_memory_fraction) == (5_000_000_000, 0.5)
    assert config.engine.cache.block_size == 32
