"""The TensorRT-LLM name checker, against fake modules here and the real one where installed."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from build_engines.check_trtllm_names import build_checks, main
from build_engines.commands import Toolchain


class AllFields(dict):
    """A pydantic ``model_fields`` that holds every name except ``lacks``."""

    def __init__(self, lacks: set[str]) -> None:
        super().__init__()
        self.lacks = lacks

    def __contains__(self, name: object) -> bool:
        return name not in self.lacks


def fake_modules(missing: dict[str, set[str]] | None = None) -> Any:
    """``import_module`` stand-in where every module and name exists except ``missing``
    (class name -> names it lacks). Classes of ``tensorrt_llm.llmapi*`` look like pydantic
    models (``model_fields``); the others like pybind classes and enums (attributes)."""
    missing = missing or {}

    def make_class(module: str, cls_name: str) -> type:
        lacks = missing.get(cls_name, set())
        if module.startswith("tensorrt_llm.llmapi"):
            return type(cls_name, (), {"model_fields": AllFields(lacks)})

        class Binding(type):
            def __getattr__(cls, name: str) -> Any:
                if name in lacks or name.startswith("__") or name == "model_fields":
                    raise AttributeError(name)
                return name

        return Binding(cls_name, (), {})

    class FakeModule:
        __version__ = "1.2.0"

        def __init__(self, name: str) -> None:
            self.name = name

        def __getattr__(self, cls_name: str) -> Any:
            return make_class(self.name, cls_name)

    return FakeModule


FLAGS = [
    # quantize.py
    "model_dir", "output_dir", "dtype", "qformat", "kv_cache_dtype", "calib_dataset",
    "calib_size", "tp_size", "pp_size", "export_format",
    # trtllm-build
    "checkpoint_dir", "max_batch_size", "max_num_tokens", "max_input_len", "max_seq_len",
    "kv_cache_type", "tokens_per_block", "context_fmha", "use_paged_context_fmha",
    "use_fp8_context_fmha", "multiple_profiles", "reduce_fusion", "user_buffer",
    "norm_quant_fusion", "workers",
]  # fmt: skip
HELP = " ".join(f"--{flag}" for flag in FLAGS)


def run(**kwargs: Any) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["--examples-dir", "examples"], out=out, **kwargs)
    return code, out.getvalue()


def test_all_names_present() -> None:
    code, out = run(import_module=fake_modules(), run_help=lambda cmd: HELP)
    assert code == 0
    assert "tensorrt_llm 1.2.0" in out
    assert "MISSING" not in out
    assert (
        "OK       tensorrt_llm.bindings.executor.ExtendedRuntimePerfKnobConfig.cuda_graph_mode"
        in out
    )
    assert "OK       tensorrt_llm.llmapi.KvCacheConfig.free_gpu_memory_fraction" in out
    assert "OK       tensorrt_llm.bindings.executor.CapacitySchedulerPolicy.STATIC_BATCH" in out
    assert "OK       trtllm-build --use_fp8_context_fmha" in out
    assert "OK       quantize.py --kv_cache_dtype" in out


def test_missing_llm_api_field_is_reported() -> None:
    code, out = run(
        import_module=fake_modules({"KvCacheConfig": {"tokens_per_block"}}),
        run_help=lambda cmd: HELP,
    )
    assert code == 1
    assert "MISSING  tensorrt_llm.llmapi.KvCacheConfig.tokens_per_block" in out
    # The executor binding of the same name is a different class and still passes.
    assert "OK       tensorrt_llm.bindings.executor.KvCacheConfig.free_gpu_memory_fraction" in out


def test_missing_binding_is_reported() -> None:
    modules = fake_modules({"ExtendedRuntimePerfKnobConfig": {"cuda_graph_mode"}})
    code, out = run(import_module=modules, run_help=lambda cmd: HELP)
    assert code == 1
    assert (
        "MISSING  tensorrt_llm.bindings.executor.ExtendedRuntimePerfKnobConfig.cuda_graph_mode: "
        "ExtendedRuntimePerfKnobConfig has no 'cuda_graph_mode'"
    ) in out


def test_missing_flag_is_reported() -> None:
    # A flag that is only a prefix of another must not count as present.
    help_text = HELP.replace("--reduce_fusion", "--reduce_fusion_mode")
    code, out = run(import_module=fake_modules(), run_help=lambda cmd: help_text)
    assert code == 1
    assert "MISSING  trtllm-build --reduce_fusion: not in --help" in out


def test_help_runs_once_per_tool() -> None:
    calls: list[list[str]] = []

    def run_help(cmd: list[str]) -> str:
        calls.append(cmd)
        return HELP

    checks = build_checks(fake_modules(), run_help, Toolchain(examples_dir=Path("ex")))
    for check in checks:
        check.run()
    assert calls == [["python", "ex/quantization/quantize.py"], ["trtllm-build"]]


def test_without_tensorrt_llm() -> None:
    def import_module(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    code, out = run(import_module=import_module, run_help=lambda cmd: HELP)
    assert code == 2
    assert "run this inside the NGC TensorRT-LLM container" in out


@pytest.mark.trtllm
def test_names_exist_in_installed_tensorrt_llm() -> None:
    pytest.importorskip("tensorrt_llm", reason="needs TensorRT-LLM 1.2.x (the NGC container)")
    out = io.StringIO()
    assert main([], out=out) == 0, out.getvalue()
