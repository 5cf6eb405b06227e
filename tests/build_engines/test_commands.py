"""Golden command lines and option files for the shipped build specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from build_engines.commands import Toolchain, describe_download, llm_api_options, shell
from build_engines.plan import BuildPlan, plan_from_file
from orchestrator.common.specs import CONFIGS_DIR
from tests.build_engines.helpers import PYTORCH, TOOLCHAIN, make_spec, plan_for

BUILD_CONFIGS = CONFIGS_DIR / "build"


def shipped(name: str) -> BuildPlan:
    return plan_from_file(BUILD_CONFIGS / f"{name}.yaml", TOOLCHAIN, cwd=Path("/builds"))


def test_llama3_70b_fp8_tp2_commands() -> None:
    plan = shipped("llama3-70b-fp8-h100-tp2")
    out = "/builds/engines/llama3-70b-fp8-h100-tp2"
    assert shell(plan.quantize_argv) == (
        f"python examples/quantization/quantize.py --model_dir {out}/hf "
        f"--output_dir {out}/checkpoint --dtype bfloat16 --qformat fp8 --kv_cache_dtype fp8 "
        "--calib_dataset cnn_dailymail --calib_size 512 --tp_size 2 --pp_size 1"
    )
    assert plan.build_argv is not None
    assert shell(plan.build_argv) == (
        f"trtllm-build --checkpoint_dir {out}/checkpoint --output_dir {out}/engine "
        "--max_batch_size 128 --max_num_tokens 8192 --max_input_len 8192 --max_seq_len 8192 "
        "--kv_cache_type paged --tokens_per_block 32 --context_fmha enable "
        "--use_paged_context_fmha enable --use_fp8_context_fmha enable "
        "--multiple_profiles enable --reduce_fusion enable --user_buffer disable "
        "--norm_quant_fusion disable --workers 2"
    )
    assert plan.download == (
        "huggingface_hub.snapshot_download('meta-llama/Meta-Llama-3-70B-Instruct', "
        "revision='main', allow_patterns=['*.json', '*.safetensors', 'tokenizer*'], "
        f"local_dir='{out}/hf')"
    )


def test_llama3_8b_fp8_commands() -> None:
    plan = shipped("llama3-8b-fp8-h100")
    out = "/builds/engines/llama3-8b-fp8-h100"
    assert shell(plan.quantize_argv) == (
        f"python examples/quantization/quantize.py --model_dir {out}/hf "
        f"--output_dir {out}/checkpoint --dtype bfloat16 --qformat fp8 --kv_cache_dtype fp8 "
        "--calib_dataset cnn_dailymail --calib_size 512 --tp_size 1 --pp_size 1"
    )
    assert plan.build_argv is not None
    assert shell(plan.build_argv) == (
        f"trtllm-build --checkpoint_dir {out}/checkpoint --output_dir {out}/engine "
        "--max_batch_size 256 --max_num_tokens 8192 --max_input_len 8192 --max_seq_len 8192 "
        "--kv_cache_type paged --tokens_per_block 32 --context_fmha enable "
        "--use_paged_context_fmha enable --use_fp8_context_fmha enable "
        "--multiple_profiles enable --reduce_fusion disable --user_buffer disable "
        "--norm_quant_fusion disable --workers 1"
    )


def test_llama3_8b_pytorch_commands_and_options() -> None:
    plan = shipped("llama3-8b-fp8-h100-pytorch")
    out = "/builds/engines/llama3-8b-fp8-h100-pytorch"
    assert shell(plan.quantize_argv) == (
        f"python examples/quantization/quantize.py --model_dir {out}/hf "
        f"--output_dir {out}/checkpoint --dtype bfloat16 --qformat fp8 --kv_cache_dtype fp8 "
        "--calib_dataset cnn_dailymail --calib_size 512 --export_format hf"
    )
    assert plan.build_argv is None  # no engine for the PyTorch backend
    assert llm_api_options(plan.spec) == {
        "enable_chunked_prefill": True,
        "kv_cache_config": {
            "free_gpu_memory_fraction": 0.9,
            "enable_block_reuse": True,
            "dtype": "fp8",
            "tokens_per_block": 32,
        },
        "scheduler_config": {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"},
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "max_batch_size": 256,
        "max_num_tokens": 8192,
        "max_input_len": 8192,
        "max_seq_len": 8192,
        "cuda_graph_config": {
            "batch_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256],
            "enable_padding": True,
        },
    }


def test_engine_runtime_options() -> None:
    assert llm_api_options(shipped("llama3-70b-fp8-h100-tp2").spec) == {
        "enable_chunked_prefill": True,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True},
        "scheduler_config": {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"},
        "extended_runtime_perf_knob_config": {"cuda_graph_mode": True, "cuda_graph_cache_size": 64},
    }


@pytest.mark.parametrize(
    ("overrides", "present", "absent"),
    [
        # BF16 weights with an FP8 KV cache: full precision export, KV still calibrated.
        (
            {"quantization": {"weights": "bf16"}},
            ["--qformat full_prec", "--kv_cache_dtype fp8", "--calib_size 512"],
            [],
        ),
        # Nothing quantised: no KV dtype and no calibration.
        (
            {"quantization": {"weights": "bf16", "kv_cache": "bf16"}},
            ["--qformat full_prec"],
            ["--kv_cache_dtype", "--calib_dataset", "--calib_size"],
        ),
        ({"quantization": {"kv_cache": "int8"}}, ["--kv_cache_dtype int8"], []),
    ],
)
def test_quantize_flags_follow_quantization(
    overrides: dict, present: list[str], absent: list[str], tmp_path: Path
) -> None:
    line = shell(plan_for(make_spec(overrides), tmp_path).quantize_argv)
    for flag in present:
        assert flag in line
    for flag in absent:
        assert flag not in line


def test_pytorch_options_without_explicit_graph_sizes(tmp_path: Path) -> None:
    spec = make_spec(PYTORCH, {"runtime": {"cuda_graph_batch_sizes": None}})
    assert llm_api_options(spec)["cuda_graph_config"] == {
        "max_batch_size": 48,
        "enable_padding": False,
    }
    off = make_spec(PYTORCH, {"runtime": {"cuda_graphs": False, "cuda_graph_batch_sizes": None}})
    assert llm_api_options(off)["cuda_graph_config"] is None


def test_local_source_is_used_in_place(tmp_path: Path) -> None:
    spec = make_spec({"model": {"source": "/models/llama", "revision": None}})
    plan = plan_for(spec, tmp_path)
    assert plan.quantize_argv[plan.quantize_argv.index("--model_dir") + 1] == "/models/llama"
    assert describe_download(spec, plan.layout).startswith("use local checkpoint /models/llama")


def test_toolchain_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTLLM_EXAMPLES_DIR", "/opt/trtllm/examples")
    assert Toolchain.from_env().quantize_script == Path(
        "/opt/trtllm/examples/quantization/quantize.py"
    )
    assert Toolchain.from_env("/x").examples_dir == Path("/x")
    monkeypatch.delenv("TRTLLM_EXAMPLES_DIR")
    assert Toolchain.from_env().examples_dir == Path("/app/tensorrt_llm/examples")
