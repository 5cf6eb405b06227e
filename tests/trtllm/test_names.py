"""The adapter, the fake bindings and the checker are held to one list of names."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import get_args

import pytest

import plugins.trtllm
from plugins.trtllm.config import CapacitySchedulerPolicy
from plugins.trtllm.names import BINDINGS, BY_NAME, CAPACITY_SCHEDULER_POLICIES, Binding
from tests.trtllm import fake_tensorrt_llm

PACKAGE = Path(plugins.trtllm.__file__).parent
# names.py is the list itself; check_names.py reaches the module by other names on purpose.
ADAPTER_SOURCES = sorted(
    p for p in PACKAGE.glob("*.py") if p.name not in {"names.py", "check_names.py"}
)


def public(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_fake_module_holds_exactly_the_listed_names() -> None:
    assert public(fake_tensorrt_llm) == set(BY_NAME)


@pytest.mark.parametrize("binding", BINDINGS, ids=lambda b: b.name)
def test_fake_class_matches_its_entry(binding: Binding) -> None:
    cls = getattr(fake_tensorrt_llm, binding.name)
    if binding.is_enum:
        assert {m.name for m in cls} == set(binding.members)
        return
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert {p.name for p in params} == set(binding.keywords)
    attributes = public(cls)
    assert set(binding.attributes) <= attributes <= set(binding.attributes) | set(binding.keywords)


def _binding_uses(tree: ast.AST, path: Path) -> list[str]:
    """Every use of ``tle.<Name>`` that the list does not allow, as readable lines."""
    problems = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "tle"
            and node.attr not in BY_NAME
        ):
            problems.append(f"{path.name}:{node.lineno}: tle.{node.attr} is not listed")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            inner = node.value
            if isinstance(inner.value, ast.Name) and inner.value.id == "tle":
                binding = BY_NAME.get(inner.attr)
                if binding is not None and node.attr not in binding.members:
                    problems.append(
                        f"{path.name}:{node.lineno}: {inner.attr}.{node.attr} is not listed"
                    )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if isinstance(func.value, ast.Name) and func.value.id == "tle":
                binding = BY_NAME.get(func.attr)
                if binding is None:
                    continue
                if node.args:
                    problems.append(f"{path.name}:{node.lineno}: {func.attr}() gets positionals")
                for kw in node.keywords:
                    if kw.arg not in binding.keywords:
                        problems.append(
                            f"{path.name}:{node.lineno}: {func.attr}({kw.arg}=) is not listed"
                        )
    return problems


def test_adapter_uses_only_listed_names() -> None:
    problems = []
    uses = 0
    for path in ADAPTER_SOURCES:
        tree = ast.parse(path.read_text())
        uses += sum(isinstance(n, ast.Name) and n.id == "tle" for n in ast.walk(tree))
        problems += _binding_uses(tree, path)
    assert uses > 20  # the walk found the adapter's binding calls
    assert problems == []


def test_the_source_walk_catches_an_unlisted_keyword() -> None:
    tree = ast.parse("tle.Request(input_token_ids=[], max_tokens=1, beam_width=2)")
    assert _binding_uses(tree, Path("x.py")) == ["x.py:1: Request(beam_width=) is not listed"]
    tree = ast.parse("tle.FinishReason.PAUSED\ntle.DecodingConfig()")
    assert len(_binding_uses(tree, Path("x.py"))) == 2


def test_config_policies_are_the_listed_enum_members() -> None:
    assert get_args(CapacitySchedulerPolicy) == CAPACITY_SCHEDULER_POLICIES
    assert BY_NAME["CapacitySchedulerPolicy"].members == CAPACITY_SCHEDULER_POLICIES
