"""The core's shape, read from its source: no import cycle among its modules (counting
imports inside functions and under ``TYPE_CHECKING``), no function longer than a screen,
a scheduler small enough to read in one sitting, and config names that match the
registries they pick from."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from orchestrator.core.config import AdmissionName, BatchingName, PolicyName
from orchestrator.core.sched.admission import ADMISSION_POLICIES
from orchestrator.core.sched.batching import BATCHING_STRATEGIES
from orchestrator.core.sched.ordering import ORDERING_POLICIES

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "orchestrator" / "core"
MAX_FUNCTION_LINES = 60
MAX_SCHEDULER_LINES = 400
MAX_SCHEDULER_ATTRIBUTES = 18


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(CORE.rglob("*.py"))}


def imported_core_modules(path: Path, known: set[str]) -> set[str]:
    """The core modules ``path`` imports anywhere in its source (module level, inside
    functions, under ``TYPE_CHECKING``); ``from package import name`` counts as an
    import of ``package.name`` when that is a module."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name in known}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same node, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_core_modules() -> None:
    modules = core_modules()
    known = set(modules)
    # The package's __init__ only re-exports the seams; no core module imports it.
    graph = {
        name: imported_core_modules(path, known) - {name}
        for name, path in modules.items()
        if path.name != "__init__.py"
    }
    for name, deps in graph.items():
        assert "orchestrator.core" not in deps, f"{name} imports the package, not a module"
    graph = {name: {d for d in deps if d in graph} for name, deps in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_function_in_the_core_is_longer_than_a_screen() -> None:
    long = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines}")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_scheduler_stays_small() -> None:
    path = CORE / "sched" / "scheduler.py"
    assert len(path.read_text().splitlines()) < MAX_SCHEDULER_LINES
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    attributes = {
        target.attr
        for node in ast.walk(cls)
        for target in (
            node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        )
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign)
        and isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }
    assert len(attributes) < MAX_SCHEDULER_ATTRIBUTES, sorted(attributes)


@pytest.mark.parametrize(
    ("names", "registry"),
    [
        (BatchingName, BATCHING_STRATEGIES),
        (PolicyName, ORDERING_POLICIES),
        (AdmissionName, ADMISSION_POLICIES),
    ],
    ids=["batching", "policy", "admission"],
)
def test_each_registry_holds_exactly_the_names_the_config_allows(
    names: object, registry: dict[str, object]
) -> None:
    assert set(get_args(names)) == set(registry)
