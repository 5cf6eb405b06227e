"""Constraints in LLM-API mode: passed to TensorRT-LLM as ``GuidedDecodingParams`` with
the configured ``guided_decoding_backend``, refused where that backend (or none) cannot
enforce them, and never resumed after preemption (the guide would restart)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.core import (
    AdmissionError,
    ConstraintError,
    ConstraintKind,
    ConstraintSpec,
    EngineConfig,
    EngineCore,
    SamplingParams,
    ScheduledRequest,
    SchedulerOutput,
    Submission,
)
from plugins.trtllm import TrtllmLlmApiConfig, TrtllmLlmApiExecutor
from plugins.trtllm.llm_api.guided import Guide, constraint_kinds, guide_of
from plugins.trtllm.llm_api.settings import load_settings
from tests.factories import plan_entry
from tests.trtllm import fake_llmapi
from tests.trtllm.builds import FakeBuild, write_build

SCHEMA = ConstraintSpec(ConstraintKind.JSON_SCHEMA, '{"type": "object"}')
LARK = ConstraintSpec(ConstraintKind.GRAMMAR, 'start: "a" | "b"', "tools")
CHOICE = ConstraintSpec(ConstraintKind.CHOICE, json.dumps(["yes", "n\u00f6"]))


def open_executor(tmp_path: Path, backend: str | None) -> TrtllmLlmApiExecutor:
    root = write_build(tmp_path, FakeBuild(backend="pytorch"))
    config = TrtllmLlmApiConfig(build_dir=root, guided_decoding_backend=backend)  # type: ignore[arg-type]
    return TrtllmLlmApiExecutor.open(config, load_settings(config), module=fake_llmapi)


def test_each_backend_takes_the_kinds_its_matcher_factory_compiles() -> None:
    assert constraint_kinds(None) == frozenset()
    assert ConstraintKind.GRAMMAR not in constraint_kinds("xgrammar")  # Lark is not EBNF
    assert constraint_kinds("llguidance") == frozenset(ConstraintKind)
    assert guide_of(SCHEMA, "xgrammar") == Guide("json", SCHEMA.value)
    assert guide_of(ConstraintSpec(ConstraintKind.JSON_OBJECT, ""), "llguidance") == Guide(
        "json_object", True
    )
    assert guide_of(LARK, "llguidance") == Guide("grammar", LARK.value)
    assert guide_of(CHOICE, "llguidance") == Guide("grammar", 'start: "yes" | "n\u00f6"')
    assert guide_of(CHOICE, "xgrammar") == Guide("grammar", 'root ::= "yes" | "n\u00f6"')
    with pytest.raises(ConstraintError, match="does not take grammar"):
        guide_of(LARK, "xgrammar")
    with pytest.raises(ConstraintError, match="not valid JSON"):
        guide_of(ConstraintSpec(ConstraintKind.JSON_SCHEMA, "{"), "llguidance")


def test_without_a_backend_a_constrained_request_is_refused(tmp_path: Path) -> None:
    executor = open_executor(tmp_path, None)
    try:
        assert executor.info().constraint_kinds == frozenset()
        engine = _engine(executor)
        with pytest.raises(AdmissionError, match="response_format: the executor cannot enforce"):
            engine.add_request(Submission("r", (1, 2, 3), constraint=SCHEMA))
        assert executor._owned[0].guides == []
    finally:
        executor.shutdown()


def test_xgrammar_refuses_a_lark_grammar_naming_the_field(tmp_path: Path) -> None:
    executor = open_executor(tmp_path, "xgrammar")
    try:
        engine = _engine(executor)
        with pytest.raises(AdmissionError, match="tools: the executor cannot enforce a grammar"):
            engine.add_request(Submission("r", (1, 2, 3), constraint=LARK))
    finally:
        executor.shutdown()


def _engine(executor: TrtllmLlmApiExecutor) -> EngineCore:
    info = executor.info()
    config = EngineConfig.model_validate(
        {
            "model": {"max_model_len": 256},
            "cache": {"block_size": info.block_size},
            "scheduler": {"max_batch_size": 8, "max_num_tokens": 256},
            "executor": {"type": "trtllm-llmapi", "model": "unused: the executor is given"},
        }
    )
    return EngineCore.from_config(config, executor=executor)


def _entry(tokens: list[int], start: int, handle: object) -> ScheduledRequest:
    params = SamplingParams(max_tokens=4, temperature=0)
    return plan_entry("r", tokens, start, [0, 1], True, params, constraint=handle)


def test_a_guide_reaches_generate_async_and_a_resumed_one_fails(tmp_path: Path) -> None:
    executor = open_executor(tmp_path, "llguidance")
    try:
        assert executor.info().constraint_kinds == frozenset(ConstraintKind)
        handle = executor.compile_constraint(SCHEMA)
        result = executor.execute(SchedulerOutput([_entry([5, 6, 7], 0, handle)]))
        assert set(result.sampled) == {"r"} and not result.failed
        llm = executor._owned[0]
        ((inputs, guide, backend),) = llm.guides
        assert inputs == [5, 6, 7] and backend == "llguidance"
        assert guide == fake_llmapi.GuidedDecodingParams(json=SCHEMA.value)
        token = result.sampled["r"]
        # Preempted after its first token: resubmitting would restart the guide.
        executor.execute(SchedulerOutput([], preempted_ids=["r"]))
        resumed = executor.execute(SchedulerOutput([_entry([5, 6, 7, token], 0, handle)]))
        assert "cannot resume after preemption" in resumed.failed["r"]
        assert len(llm.guides) == 1
    finally:
        executor.shutdown()
