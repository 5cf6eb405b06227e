"""One capacity model: the flagship figure by hand, the same figure from the simulator,
the planner and the engine builder, and the layering that lets them share it."""

from __future__ import annotations

import argparse
import ast
import io
from pathlib import Path

import pytest
from rich.console import Console

from build_engines.cli import main as build_engines_main
from build_engines.commands import Toolchain
from build_engines.plan import plan_from_file
from orchestrator.common.deployment import Deployment
from orchestrator.core.executor import create_executor
from orchestrator.sim import cli
from orchestrator.sim.config import load_sim_config

REPO = Path(__file__).resolve().parents[2]
SIM_CONFIG = REPO / "configs" / "sim" / "llama3-70b-fp8-h100-tp2.yaml"
BUILD_CONFIG = REPO / "configs" / "build" / "llama3-70b-fp8-h100-tp2.yaml"

# Llama-3-70B FP8 (weights and KV), BF16 embedding/LM head/norms, TP=2 on H100 SXM
# (80 GB), max_num_tokens 8192, max_batch_size 128, 32-token blocks, fraction 0.9,
# 2 GB runtime reserve: what both shipped configs describe.
FLAGSHIP_KV_TOKENS = 448_992


def flagship_kv_tokens_by_hand() -> int:
    layers, hidden, heads, kv_heads, head_dim = 80, 8192, 64, 8, 128
    mlp, vocab, tp = 28672, 128256, 2
    fp8, bf16, fp32 = 1, 2, 4
    linear_per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    linear_per_layer += 3 * hidden * mlp  # gate, up, down
    linear = layers * linear_per_layer * fp8 // tp  # split over TP
    norms = (2 * layers * hidden + hidden) * bf16  # replicated on every rank
    embedding = vocab // tp * hidden * bf16  # split by vocabulary rows
    lm_head = vocab // tp * hidden * bf16
    weights = linear + norms + embedding + lm_head
    reserve = 2_000_000_000
    activations = 8192 * bf16 * (2 * hidden + 2 * mlp // tp)  # max_num_tokens 8192
    logits = 128 * vocab * fp32  # max_batch_size 128, whole vocabulary each
    free = 80_000_000_000 - weights - reserve - activations - logits
    pool = free * 9 // 10
    per_token = layers * 2 * (kv_heads // tp) * head_dim * fp8
    tokens = pool // per_token
    blocks = -(-tokens // 32)  # TensorRT-LLM rounds whole tokens up to blocks
    return blocks * 32


def test_the_flagship_figure_is_the_arithmetic_written_out() -> None:
    assert flagship_kv_tokens_by_hand() == FLAGSHIP_KV_TOKENS


def test_the_sim_executor_and_the_build_plan_hold_the_flagship_figure() -> None:
    config = load_sim_config(SIM_CONFIG)
    info = create_executor(config.engine).info()
    assert info.num_kv_blocks * info.block_size == FLAGSHIP_KV_TOKENS
    build = plan_from_file(BUILD_CONFIG, Toolchain()).memory
    assert build.kv_tokens == FLAGSHIP_KV_TOKENS


def test_the_shipped_configs_describe_one_deployment() -> None:
    sim = load_sim_config(SIM_CONFIG).engine
    build = plan_from_file(BUILD_CONFIG, Toolchain()).spec
    options = sim.executor.options
    assert isinstance(options, Deployment)
    assert (options.model, options.hardware) == (build.model.spec, build.target.gpu)
    assert (options.weight_dtype, options.kv_dtype) == (
        build.quantization.weights,
        build.quantization.kv_cache,
    )
    assert options.activation_dtype == "bf16" and build.model.dtype == "bfloat16"
    assert options.tp == build.parallelism.tp and build.parallelism.pp == 1
    assert options.kv_memory_fraction == build.runtime.kv_cache_free_gpu_memory_fraction
    assert options.runtime_reserve_bytes == build.memory.runtime_reserve_bytes
    assert sim.scheduler.max_num_tokens == build.limits.max_num_tokens
    assert sim.scheduler.max_batch_size == build.limits.max_batch_size
    assert sim.cache.block_size == build.limits.tokens_per_block
    assert sim.model.max_model_len == build.limits.max_seq_len


def run_orchestrator(*argv: str) -> None:
    parser = argparse.ArgumentParser(prog="orchestrator")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    assert args.func(args) == 0


def test_simulate_plan_and_build_engines_plan_print_the_same_kv_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    figure = f"{FLAGSHIP_KV_TOKENS:,}"
    run_orchestrator("simulate", "--config", str(SIM_CONFIG), "--num-requests", "20")
    simulated = capsys.readouterr().out
    assert "KV tokens per replica" in simulated and figure in simulated

    flags = ["--model", "llama3-70b", "--hardware", "h100-sxm", "--dtype", "fp8", "--tp", "2"]
    slo = ["--rate", "2", "--slo-ttft-ms", "500", "--slo-tpot-ms", "80"]
    run_orchestrator("plan", "--config", str(SIM_CONFIG), *flags, *slo, "--num-requests", "20")
    assert figure in capsys.readouterr().out

    buf = io.StringIO()
    assert (
        build_engines_main(["plan", str(BUILD_CONFIG)], console=Console(file=buf, width=250)) == 0
    )
    assert figure in buf.getvalue()


def test_orchestrator_never_imports_plugins() -> None:
    offenders = []
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            offenders += [
                f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "plugins"
            ]
    assert offenders == []
