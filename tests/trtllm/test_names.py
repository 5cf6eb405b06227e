"""The adapters, the fakes and the checker are held to one list of names per mode."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any, get_args

import pytest

import plugins.trtllm
from plugins.trtllm import check_names
from plugins.trtllm.config import CapacitySchedulerPolicy
from plugins.trtllm.names import (
    ASYNC_ITERATION,
    BINDINGS,
    BY_NAME,
    CAPACITY_SCHEDULER_POLICIES,
    LLM_API_BINDINGS,
    LLM_API_BY_NAME,
    Binding,
)
from tests.trtllm import fake_llmapi, fake_tensorrt_llm
from tests.trtllm.builds import FakeBuild, write_build

PACKAGE = Path(plugins.trtllm.__file__).parent
# names.py is the list itself; check_names.py reaches the modules by other names on purpose.
ADAPTER_SOURCES = sorted(
    p for p in PACKAGE.rglob("*.py") if p.name not in {"names.py", "check_names.py"}
)
MODES = [
    pytest.param(fake_tensorrt_llm, BINDINGS, id="engine"),
    pytest.param(fake_llmapi, LLM_API_BINDINGS, id="llm-api"),
]
SIGNATURES = [
    pytest.param(fake_tensorrt_llm, BINDINGS, check_names.ENGINE_ARGUMENTS, id="engine"),
    pytest.param(fake_llmapi, LLM_API_BINDINGS, check_names.LLM_API_ARGUMENTS, id="llm-api"),
]
ALL = [
    *[pytest.param(fake_tensorrt_llm, b, id=f"engine-{b.name}") for b in BINDINGS],
    *[pytest.param(fake_llmapi, b, id=f"llm-api-{b.name}") for b in LLM_API_BINDINGS],
]


def public(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def is_pydantic(cls: type) -> bool:
    return hasattr(cls, "model_fields")


@pytest.mark.parametrize(("module", "bindings"), MODES)
def test_fake_module_holds_exactly_the_listed_names(
    module: ModuleType, bindings: tuple[Binding, ...]
) -> None:
    assert public(module) == {b.name for b in bindings}


@pytest.mark.parametrize(("module", "binding"), ALL)
def test_fake_class_matches_its_entry(module: ModuleType, binding: Binding) -> None:
    cls = getattr(module, binding.name)
    if binding.is_enum:
        assert {m.name for m in cls} == set(binding.members)
        return
    params = list(inspect.signature(cls).parameters.values())
    if not binding.keywords:
        assert params == []  # the adapter constructs none of these
    else:
        assert [p.name for p in params] == list(binding.keywords)  # the real order
        kinds = [p.kind for p in params]
        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert kinds[: binding.positional] == [positional] * binding.positional
        assert set(kinds[binding.positional :]) <= {inspect.Parameter.KEYWORD_ONLY}
    if is_pydantic(cls):
        assert set(cls.model_fields) == set(binding.keywords)
        return
    attributes = public(cls)
    assert set(binding.attributes) <= attributes <= set(binding.attributes) | set(binding.keywords)


@pytest.mark.parametrize(("module", "bindings", "arguments"), SIGNATURES)
def test_fake_constructors_take_positions_and_none_as_the_real_ones(
    module: ModuleType, bindings: tuple[Binding, ...], arguments: dict[str, Any]
) -> None:
    # The checks check_names runs against the real modules, run here against the fakes.
    checks = check_names.signature_checks(module, bindings, arguments)
    assert len(checks) == sum(1 + len(b.keywords) for b in bindings if b.name in arguments)
    failures = {c.label: c.run() for c in checks}
    assert {label: why for label, why in failures.items() if why is not None} == {}


def test_the_fake_executor_and_llm_refuse_none_where_the_real_ones_do(tmp_path: Path) -> None:
    engine = write_build(tmp_path / "engine")
    executor_bindings = fake_tensorrt_llm
    executor_arguments = {
        "model_path": engine / "engine",
        "model_type": executor_bindings.ModelType.DECODER_ONLY,
        "executor_config": executor_bindings.ExecutorConfig(),
    }
    checkpoint = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch")) / "checkpoint"
    llm_arguments = {
        "model": str(checkpoint),
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "kv_cache_config": fake_llmapi.KvCacheConfig(),
        "enable_chunked_prefill": True,
        "scheduler_config": fake_llmapi.SchedulerConfig(),
        "max_batch_size": 8,
        "max_input_len": 64,
        "max_seq_len": 128,
        "max_num_tokens": 64,
        "cuda_graph_config": fake_llmapi.CudaGraphConfig(),
        "guided_decoding_backend": "llguidance",
        "enable_iter_perf_stats": True,
    }
    for module, binding, arguments in [
        (executor_bindings, BY_NAME["Executor"], executor_arguments),
        (fake_llmapi, LLM_API_BY_NAME["LLM"], llm_arguments),
    ]:
        cls = getattr(module, binding.name)
        assert set(arguments) == set(binding.keywords)
        leading = binding.keywords[: binding.positional]
        cls(
            *[arguments[k] for k in leading],
            **{k: arguments[k] for k in arguments if k not in leading},
        ).shutdown()
        for keyword in binding.keywords:
            if keyword in binding.required:
                with pytest.raises((TypeError, ValueError)):
                    cls(**{**arguments, keyword: None})
            else:
                cls(**{**arguments, keyword: None}).shutdown()


def test_request_outputs_are_async_iterables() -> None:
    for name in ASYNC_ITERATION:
        assert callable(getattr(fake_llmapi.RequestOutput, name))


LISTS = {"executor_bindings": BY_NAME, "llmapi": LLM_API_BY_NAME}


def _binding_uses(tree: ast.AST, path: Path) -> list[str]:
    """Every use of ``executor_bindings.<Name>`` or ``llmapi.<Name>`` that its list does
    not allow, as readable lines."""
    problems = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in LISTS
            and node.attr not in LISTS[node.value.id]
        ):
            problems.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr} is not listed")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner = node.value
            if isinstance(inner.value, ast.Name) and inner.value.id in LISTS:
                binding = LISTS[inner.value.id].get(inner.attr)
                if binding is not None and node.attr not in binding.members:
                    problems.append(
                        f"{path.name}:{node.lineno}: {inner.attr}.{node.attr} is not listed"
                    )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if isinstance(func.value, ast.Name) and func.value.id in LISTS:
                binding = LISTS[func.value.id].get(func.attr)
                if binding is None:
                    continue
                if node.args:
                    problems.append(f"{path.name}:{node.lineno}: {func.attr}() gets positionals")
                for kw in node.keywords:
                    # A ``**`` splat holds per-release keywords; check_names' coverage
                    # check sees what it passes.
                    if kw.arg is not None and kw.arg not in binding.keywords:
                        problems.append(
                            f"{path.name}:{node.lineno}: {func.attr}({kw.arg}=) is not listed"
                        )
    return problems


def test_adapters_use_only_listed_names() -> None:
    problems = []
    uses = dict.fromkeys(LISTS, 0)
    for path in ADAPTER_SOURCES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in LISTS:
                uses[node.id] += 1
        problems += _binding_uses(tree, path)
    # The walk found the calls of both modes.
    assert uses["executor_bindings"] > 15 and uses["llmapi"] > 10
    assert problems == []


def test_the_source_walk_catches_an_unlisted_keyword() -> None:
    tree = ast.parse("executor_bindings.Request(input_token_ids=[], max_tokens=1, beam_width=2)")
    assert _binding_uses(tree, Path("x.py")) == ["x.py:1: Request(beam_width=) is not listed"]
    tree = ast.parse("executor_bindings.FinishReason.PAUSED\nexecutor_bindings.DecodingConfig()")
    assert len(_binding_uses(tree, Path("x.py"))) == 2
    tree = ast.parse("llmapi.SamplingParams(n=2)\nllmapi.LLM('m')")
    assert _binding_uses(tree, Path("x.py")) == [
        "x.py:1: SamplingParams(n=) is not listed",
        "x.py:2: LLM() gets positionals",
    ]


def test_config_policies_are_the_listed_enum_members() -> None:
    assert get_args(CapacitySchedulerPolicy) == CAPACITY_SCHEDULER_POLICIES
    assert BY_NAME["CapacitySchedulerPolicy"].members == CAPACITY_SCHEDULER_POLICIES
    assert LLM_API_BY_NAME["CapacitySchedulerPolicy"].members == CAPACITY_SCHEDULER_POLICIES
