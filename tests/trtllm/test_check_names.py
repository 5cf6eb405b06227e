"""The name checker, run here against the fakes (and broken copies of them)."""

from __future__ import annotations

import io
import types
from pathlib import Path
from typing import Any

from plugins.trtllm import check_names
from plugins.trtllm.names import (
    ASYNC_ITERATION,
    BINDINGS,
    GENERATE_ASYNC_KEYWORDS,
    GENERATE_ASYNC_OPTIONAL,
    LLM_API_BINDINGS,
    LLM_API_MODULE,
    MODULE,
)
from tests.trtllm import fake_llmapi, fake_tensorrt_llm
from tests.trtllm.builds import FakeBuild, write_build
from tests.trtllm.fake_llmapi._llm import _TorchLlmArgs
from tests.trtllm.fake_llmapi._releases import release_1_2

TOP = types.SimpleNamespace(__version__="1.2.1")


def copy_of(module: Any, **replaced: Any) -> types.SimpleNamespace:
    names = {n: getattr(module, n) for n in module.__all__}
    names.update(replaced)
    return types.SimpleNamespace(**{k: v for k, v in names.items() if v is not None})


def llmapi(**replaced: Any) -> types.SimpleNamespace:
    """The fake LLM API with the TorchLlmArgs the checker reads the LLM keywords from."""
    return copy_of(fake_llmapi, **{"TorchLlmArgs": _TorchLlmArgs, **replaced})


def run(engine: Any = fake_tensorrt_llm, llm_api: Any = None, *argv: str) -> tuple[int, str]:
    modules = {"tensorrt_llm": TOP, MODULE: engine, LLM_API_MODULE: llm_api or llmapi()}
    out = io.StringIO()

    def import_module(name: str) -> Any:
        module = modules.get(name)  # in-executor modules: absent, so that mode is skipped
        if module is None:
            raise ImportError(f"No module named {name!r}")
        return module

    return check_names.main(list(argv), import_module=import_module, out=out), out.getvalue()


def ok_lines(text: str) -> int:
    return sum(line.startswith("OK ") for line in text.splitlines())


def test_every_check_of_both_modes_passes_on_the_fakes() -> None:
    status, text = run()
    assert status == 0, text
    assert "MISSING" not in text
    assert "engine mode: tensorrt_llm.bindings.executor (TensorRT-LLM 1.2.1)" in text
    engine_names = sum(1 + len(b.members) + len(b.attributes) for b in BINDINGS)
    engine_signatures = sum(
        1 + len(b.keywords) for b in BINDINGS if b.name in check_names.ENGINE_ARGUMENTS
    )
    engine_constructions = len(check_names.representative_settings()) + len(
        check_names.REPRESENTATIVE_SAMPLING
    )
    llm = next(b for b in LLM_API_BINDINGS if b.name == "LLM")
    llm_names = sum(1 + len(b.members) + len(b.attributes) for b in LLM_API_BINDINGS)
    llm_names += len(ASYNC_ITERATION) + len(llm.keywords) - 1
    llm_names += len(GENERATE_ASYNC_KEYWORDS) + len(GENERATE_ASYNC_OPTIONAL)
    llm_names += sum(len(b.optional) for b in LLM_API_BINDINGS)  # present-or-absent lines
    llm_signatures = sum(
        1 + len(b.keywords) for b in LLM_API_BINDINGS if b.name in check_names.LLM_API_ARGUMENTS
    )
    llm_constructions = (
        len(check_names.representative_llm_settings())
        + len(check_names.REPRESENTATIVE_SAMPLING)
        + len(check_names.REPRESENTATIVE_GUIDES)
    )
    expected = engine_names + engine_signatures + engine_constructions + 1
    expected += llm_names + llm_signatures + llm_constructions + 1
    assert ok_lines(text) == expected
    assert text.count("OK       every listed constructor keyword was exercised") == 2
    assert "OK       ExecutorConfig(kv_cache_config=None) refuses None" in text
    assert "OK       KvCacheConfig(free_gpu_memory_fraction=None) accepts None" in text


def test_a_release_without_the_engine_backend_checks_llm_api_mode_only() -> None:
    status, text = run(None)
    assert status == 0, text
    assert "SKIPPED  engine mode: tensorrt_llm.bindings.executor is not importable" in text
    assert "llm-api mode: tensorrt_llm.llmapi" in text


def test_a_release_whose_bindings_have_no_executor_checks_llm_api_mode_only() -> None:
    # 1.3.0rc21 and later: tensorrt_llm.bindings.executor still imports (the PyTorch
    # backend uses its value types), but Executor itself is gone (NVIDIA/TensorRT-LLM#16369).
    status, text = run(copy_of(fake_tensorrt_llm, Executor=None), llmapi(), "--mode", "all")
    assert status == 0, text
    assert "SKIPPED  engine mode: tensorrt_llm.bindings.executor has no Executor" in text
    assert "engine mode: tensorrt_llm.bindings.executor (" not in text
    assert "llm-api mode: tensorrt_llm.llmapi" in text
    assert "MISSING" not in text
    status, text = run(copy_of(fake_tensorrt_llm, Executor=None), llmapi(), "--mode", "engine")
    assert status == 2, text


def test_per_release_keywords_are_reported_and_checked_only_where_present() -> None:
    newest = run(fake_tensorrt_llm, llmapi())[1]
    assert "KvCacheConfig.use_kv_cache_manager_v2 (per release): present" in newest
    assert "OK       KvCacheConfig(use_kv_cache_manager_v2=None) refuses None" in newest
    assert "LLM.generate_async(priority=) (per release): present" in newest
    status, older = run(fake_tensorrt_llm, release_1_2(llmapi()))
    assert status == 0, older
    assert "KvCacheConfig.use_kv_cache_manager_v2 (per release): absent here" in older
    assert "SchedulerConfig.waiting_queue_policy (per release): absent here" in older
    assert "LLM.generate_async(priority=) (per release): absent here" in older
    assert "use_kv_cache_manager_v2=None" not in older


def test_nothing_importable_exits_2() -> None:
    out = io.StringIO()

    def missing(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    assert check_names.main([], import_module=missing, out=out) == 2
    assert "run this inside the NGC TensorRT-LLM container" in out.getvalue()


def test_a_missing_class_is_reported() -> None:
    status, text = run(copy_of(fake_tensorrt_llm, KvCacheStats=None))
    assert status == 1
    assert "MISSING  KvCacheStats: tensorrt_llm.bindings.executor has no KvCacheStats" in text
    assert "MISSING  KvCacheStats.max_num_blocks" in text


def test_a_renamed_constructor_keyword_is_reported() -> None:
    real = fake_tensorrt_llm.OutputConfig

    def output_config(
        return_log_probs: bool | None = None, *, exclude_input: bool | None = None
    ) -> Any:
        return real(return_log_probs, exclude_input_from_output=exclude_input)

    status, text = run(copy_of(fake_tensorrt_llm, OutputConfig=output_config))
    assert status == 1
    assert "MISSING  Request (greedy): TypeError" in text
    assert "exclude_input_from_output" in text


def test_a_missing_method_is_reported() -> None:
    status, text = run(copy_of(fake_tensorrt_llm, Executor=type("Executor", (), {"shutdown": 0})))
    assert status == 1
    assert "MISSING  Executor.cancel_request: Executor has no 'cancel_request'" in text


def test_a_constructor_that_takes_none_where_the_real_one_must_not_is_reported() -> None:
    # The laxity the fake once had: None for a C++ const& parameter taken as the default.
    real = fake_tensorrt_llm.ExecutorConfig

    def lax(*args: Any, kv_cache_config: Any = None, **kwargs: Any) -> Any:
        return real(
            *args, kv_cache_config=kv_cache_config or fake_tensorrt_llm.KvCacheConfig(), **kwargs
        )

    status, text = run(copy_of(fake_tensorrt_llm, ExecutorConfig=lax))
    assert status == 1
    assert "MISSING  ExecutorConfig(kv_cache_config=None) refuses None: accepted" in text


def test_a_keyword_only_form_where_the_real_one_is_positional_is_reported() -> None:
    real = fake_tensorrt_llm.KvCacheConfig

    def keyword_only(*, enable_block_reuse: bool = True, **kwargs: Any) -> Any:
        return real(enable_block_reuse, **kwargs)

    status, text = run(copy_of(fake_tensorrt_llm, KvCacheConfig=keyword_only))
    assert status == 1
    assert "MISSING  KvCacheConfig(enable_block_reuse, max_tokens, ...): TypeError" in text


def test_an_llm_keyword_that_is_no_torch_llm_args_field_is_reported() -> None:
    fields = {k: v for k, v in _TorchLlmArgs.model_fields.items() if k != "enable_iter_perf_stats"}
    older = types.SimpleNamespace(model_fields=fields)
    status, text = run(fake_tensorrt_llm, llmapi(TorchLlmArgs=older))
    assert status == 1
    assert "MISSING  TorchLlmArgs.enable_iter_perf_stats" in text


def test_an_llm_api_sampling_field_that_is_gone_is_reported() -> None:
    real = fake_llmapi.SamplingParams

    def without_ignore_eos(**kwargs: Any) -> Any:
        if "ignore_eos" in kwargs:
            raise TypeError("__init__() got an unexpected keyword argument 'ignore_eos'")
        return real(**kwargs)

    status, text = run(fake_tensorrt_llm, llmapi(SamplingParams=without_ignore_eos))
    assert status == 1
    assert "MISSING  SamplingParams (greedy): TypeError" in text


def test_a_keyword_no_case_passes_is_reported() -> None:
    recorder = check_names.Recorder(fake_tensorrt_llm)
    for check in check_names.construction_checks(recorder)[:1]:  # executor config only
        assert check.run() is None
    reason = check_names.coverage_check(recorder).run()
    assert reason is not None and "Request(input_token_ids=)" in reason


def test_live_runs_generate_in_both_modes(tmp_path: Path) -> None:
    engine = write_build(tmp_path / "engine")
    pytorch = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch"))
    argv = ["--engine-dir", str(engine), "--model", str(pytorch)]
    status, text = run(fake_tensorrt_llm, None, *argv)
    assert status == 0, text
    assert f"OK       live run on {engine}" in text
    assert f"OK       live run on {pytorch}" in text
    assert text.count("greedy tokens: [") == 2
    assert "KV blocks: 230 (" in text  # the pytorch build's cache: 0.9 x 4096 tokens / 16


def test_live_runs_report_bad_folders(tmp_path: Path) -> None:
    argv = ["--engine-dir", str(tmp_path), "--model", str(tmp_path / "none")]
    status, text = run(fake_tensorrt_llm, None, *argv)
    assert status == 1
    assert f"MISSING  live run on {tmp_path}: could not start: ConfigError" in text
    assert f"MISSING  live run on {tmp_path / 'none'}: could not start: OSError" in text
