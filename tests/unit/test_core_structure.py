"""The core's house rules (docs/architecture.md, "House rules"), read from its source: no
import cycle among its modules (counting imports inside functions and under
``TYPE_CHECKING``), no function longer than a screen unless a comment says why, the
scheduler's own state set up in one place (a feature keeps its state in a collaborator),
and config names that match the registries they pick from."""

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
# A longer function says why in a comment on the line above its ``def`` (or its first
# decorator) that starts with this.
LONG_FUNCTION_MARK = "# long:"
# Bounds with room to grow (the scheduler has 17 attributes and about 400 lines): they
# catch a drift, not the next honest change. A change that needs more moves a feature's
# state into a collaborator rather than raising them.
MAX_SCHEDULER_ATTRIBUTES = 24
MAX_MODULE_LINES = 600


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


def long_functions(path: Path) -> list[str]:
    """The functions of ``path`` over ``MAX_FUNCTION_LINES`` lines with no
    ``LONG_FUNCTION_MARK`` comment above them, as ``path:line name: lines``."""
    source = path.read_text()
    lines = source.splitlines()
    long = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = lines[first - 2].strip() if first > 1 else ""
            if length > MAX_FUNCTION_LINES and not above.startswith(LONG_FUNCTION_MARK):
                long.append(f"{path}:{node.lineno} {node.name}: {length}")
    return long


def test_no_function_in_the_core_is_longer_than_a_screen_unless_it_says_why() -> None:
    long = [f for path in sorted(CORE.rglob("*.py")) for f in long_functions(path)]
    assert not long, (
        f"functions over {MAX_FUNCTION_LINES} lines with no '{LONG_FUNCTION_MARK} <why>' "
        f"comment above them: {long}"
    )


def test_the_long_function_rule_sees_a_long_function_and_its_reason(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    plain = tmp_path / "probe.py"
    plain.write_text(f"def f() -> None:\n{body}")
    assert [entry.split(" ", 1)[1] for entry in long_functions(plain)] == [
        f"f: {MAX_FUNCTION_LINES + 1}"
    ]
    plain.write_text(
        f"{LONG_FUNCTION_MARK} one table, read top to bottom\ndef f() -> None:\n{body}"
    )
    assert long_functions(plain) == []


def scheduler_attributes() -> dict[str, set[str]]:
    """The ``self.<name>`` the ``Scheduler`` class assigns, by the method assigning it."""
    path = CORE / "sched" / "scheduler.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    found: dict[str, set[str]] = {}
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef):
            continue
        for node in ast.walk(method):
            if not isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    found.setdefault(method.name, set()).add(target.attr)
    return found


def test_the_scheduler_sets_up_its_own_state_in_one_place() -> None:
    """A feature's state lives in a collaborator (a policy, the KV manager, the SLO
    tracker) behind a hook, so every attribute of the scheduler is set up in
    ``__init__`` (other methods update, never add), and there are few of them."""
    by_method = scheduler_attributes()
    attributes = by_method.pop("__init__", set())
    added = {m: sorted(a - attributes) for m, a in by_method.items() if a - attributes}
    assert not added, f"scheduler attributes first set outside __init__: {added}"
    assert len(attributes) <= MAX_SCHEDULER_ATTRIBUTES, sorted(attributes)


def test_no_core_module_is_longer_than_a_sitting() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted(CORE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"core modules over {MAX_MODULE_LINES} lines: {long}"


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
