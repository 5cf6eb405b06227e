"""The LLM-API executor with ``scheduling: in_executor``, through the fake LLM API: the
option, the start-up gate, the installation before the LLM is built, the LLM options it
adds, the facts each submission registers, and switching back."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import ConfigError, EngineConfig
from orchestrator.core.request import SamplingParams
from plugins.trtllm import TrtllmError
from plugins.trtllm.in_executor import install as inst
from plugins.trtllm.in_executor.facts import RequestFacts
from plugins.trtllm.llm_api.config import TrtllmLlmApiConfig
from plugins.trtllm.llm_api.executor import TrtllmLlmApiExecutor
from tests.trtllm import fake_llmapi
from tests.trtllm.builds import FakeBuild, write_build
from tests.trtllm.conftest import LlmCalls, spy_llmapi
from tests.trtllm.plans import Seq, prompt_of, step
from tests.trtllm.test_in_executor import fake_release_modules


def engine_config(root: Path, **executor: Any) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "model": {"max_model_len": 512},
            "scheduler": {"max_batch_size": 8, "max_num_tokens": 256, "policy": "priority"},
            "cache": {"block_size": 16},
            "executor": {"type": "trtllm-llmapi", "build_dir": str(root), **executor},
        }
    )


def overlap_llmapi(calls: LlmCalls, creator: Any) -> types.SimpleNamespace:
    """The spy LLM API, whose LLM also takes ``disable_overlap_scheduler`` (a TorchLlmArgs
    field the fake leaves out) and checks that our factory is installed by then."""
    base = spy_llmapi(calls).LLM

    class LLM(base):  # type: ignore[misc, valid-type]
        def __init__(self, model: Any, *, disable_overlap_scheduler: bool, **kwargs: Any) -> None:
            built = creator.create_py_executor_instance()  # what the worker would do
            calls.options.append({"wrapped_scheduler": built.scheduler})
            calls.options.append({"disable_overlap_scheduler": disable_overlap_scheduler})
            super().__init__(model, **kwargs)

    names = {n: getattr(fake_llmapi, n) for n in fake_llmapi.__all__}
    names["LLM"] = LLM
    return types.SimpleNamespace(**names)


def start(tmp_path: Path, version: str, calls: LlmCalls, monkeypatch: pytest.MonkeyPatch) -> Any:
    root = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch"))
    engine = engine_config(root, scheduling="in_executor")
    modules = fake_release_modules(version)
    monkeypatch.setattr(TrtllmLlmApiExecutor, "import_module", staticmethod(modules.__getitem__))
    monkeypatch.delenv(inst.SINGLE_PROCESS_ENV, raising=False)
    llmapi = overlap_llmapi(calls, modules[inst.CREATOR_MODULE])
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    return TrtllmLlmApiExecutor.from_config(options, engine, module=llmapi), modules


def test_the_option_defaults_to_front_and_refuses_other_values() -> None:
    assert TrtllmLlmApiConfig(model="m").scheduling == "front"
    with pytest.raises(ValueError, match="in_executor"):
        TrtllmLlmApiConfig(model="m", scheduling="inside")  # type: ignore[arg-type]


def test_an_unchecked_release_is_refused_at_start_naming_the_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = LlmCalls()
    with pytest.raises(TrtllmError, match=r"checked against TensorRT-LLM 1\.2\.x and 1\.3\.x"):
        start(tmp_path, "1.4.0rc4", calls, monkeypatch)
    assert calls.options == [], "no LLM was built"


def test_without_tensorrt_llm_the_mode_says_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch"))
    engine = engine_config(root, scheduling="in_executor")

    def missing(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(TrtllmLlmApiExecutor, "import_module", staticmethod(missing))
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    with pytest.raises(TrtllmError, match=r"needs TensorRT-LLM 1\.2\.x and 1\.3\.x"):
        TrtllmLlmApiExecutor.from_config(options, engine, module=spy_llmapi(LlmCalls()))


def test_a_checked_release_gets_our_scheduler_before_the_llm_and_facts_per_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugins.trtllm.in_executor.adapter import CoreRequestScheduler

    calls = LlmCalls()
    executor, modules = start(tmp_path, "1.2.1", calls, monkeypatch)
    try:
        wrapped, overlap = calls.options[0], calls.options[1]
        assert isinstance(wrapped["wrapped_scheduler"], CoreRequestScheduler)
        assert overlap == {"disable_overlap_scheduler": True}
        kv = calls.options[2]["kv_cache_config"]
        assert kv.enable_block_reuse is False  # reuse would move TensorRT-LLM's position
        sampling = SamplingParams(max_tokens=3, temperature=0)
        seq = Seq("a", prompt_of(5, 1), blocks=[0], sampling=sampling)
        step(executor, [seq])
        output = calls.submitted[-1][2]
        mode = executor._owned[0]
        facts = mode.facts.take(output.request_id)
        assert facts == RequestFacts(priority=0, slo_class=None, tenant=None, arrival_time=0.0)
    finally:
        executor.shutdown()
    creator = modules[inst.CREATOR_MODULE]
    assert creator.create_py_executor_instance().scheduler == "SimpleScheduler"  # undone


def test_more_than_one_gpu_rank_is_refused_with_the_way_back(tmp_path: Path) -> None:
    root = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch", tp=2))
    engine = engine_config(root, scheduling="in_executor")
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    with pytest.raises(ConfigError, match=r"one GPU rank.*Remove executor\.scheduling"):
        TrtllmLlmApiExecutor.resolve(options, engine)
    front = options.model_copy(update={"scheduling": "front"})
    assert TrtllmLlmApiExecutor.resolve(front, engine).in_executor is None


def test_a_plans_facts_reach_the_channel_under_the_llms_request_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.core.output import ScheduledRequest, SchedulerOutput

    calls = LlmCalls()
    executor, _ = start(tmp_path, "1.3.0rc27", calls, monkeypatch)
    try:
        sampling = SamplingParams(max_tokens=2, temperature=0)
        planned = ScheduledRequest(
            "r", prompt_of(4, 3), 0, [0], True, sampling, 2, "chat", "acme", 4.5
        )
        executor.execute(SchedulerOutput([planned]))
        output = calls.submitted[-1][2]
        facts = executor._owned[0].facts.take(output.request_id)
        assert facts == RequestFacts(priority=2, slo_class="chat", tenant="acme", arrival_time=4.5)
    finally:
        executor.shutdown()
