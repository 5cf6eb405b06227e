"""The rooms of the project and what each may import (docs/architecture.md):

- ``orchestrator/core`` imports only itself, the standard library, pydantic and PyYAML:
  no torch, numpy, FastAPI or TensorRT-LLM, and nothing else of the project;
- the rest of ``orchestrator`` uses the core through ``orchestrator.core`` (the seams its
  ``__init__`` exports), never a core submodule, and never imports ``plugins``;
- only the gateway imports FastAPI, Starlette or uvicorn;
- every room of the table (``common``, ``gateway``, ``sim``, ``bench``, ``plugins``,
  ``build_engines``) imports the project only from itself, the core's seams and
  ``orchestrator.common`` (so ``plugins`` never import ``build_engines``, nor the other way).

Imports are read from the source (every ``import`` statement, lazy ones included).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE_THIRD_PARTY = {"msgspec", "pydantic", "pydantic_core", "yaml"}
WEB = {"fastapi", "starlette", "uvicorn"}
Rule = Callable[[str], str | None]


def imports(path: Path) -> list[str]:
    """Every module ``path`` imports, as dotted names (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names.append(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                names.append(node.module)
    return names


def files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def top(name: str) -> str:
    return name.split(".")[0]


def violations(paths: list[Path], rule: Rule) -> list[str]:
    found = []
    for path in paths:
        for name in imports(path):
            reason = rule(name)
            if reason:
                found.append(f"{path.relative_to(ROOT)} imports {name}: {reason}")
    return found


def core_rule(name: str) -> str | None:
    if name == "orchestrator.core" or name.startswith("orchestrator.core."):
        return None
    if top(name) in sys.stdlib_module_names or top(name) in CORE_THIRD_PARTY:
        return None
    return "the core imports only itself, the standard library, msgspec, pydantic and yaml"


def app_rule(in_gateway: bool) -> Rule:
    def rule(name: str) -> str | None:
        if top(name) == "plugins":
            return "orchestrator never imports plugins"
        if name.startswith("orchestrator.core."):
            return "use the seams that orchestrator.core exports"
        if top(name) in WEB and not in_gateway:
            return "only the gateway imports the web framework"
        return None

    return rule


PROJECT = ("orchestrator", "plugins", "build_engines")
SHARED = ("orchestrator.core", "orchestrator.common")

# docs/architecture.md's rooms below the core: where each lives, as a dotted prefix.
ROOMS = {
    "orchestrator/common": "orchestrator.common",
    "orchestrator/gateway": "orchestrator.gateway",
    "orchestrator/sim": "orchestrator.sim",
    "orchestrator/bench": "orchestrator.bench",
    "plugins": "plugins",
    "build_engines": "build_engines",
}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def room_rule(room: str) -> Rule:
    """A room of the table imports the project only from itself, the core's seams and
    the shared vocabulary."""

    def rule(name: str) -> str | None:
        if top(name) not in PROJECT or within(name, room) or name == "orchestrator.core":
            return None
        if within(name, "orchestrator.common"):
            return None
        return f"{room} may import only itself, the core's seams and orchestrator.common"

    return rule


def test_the_core_imports_nothing_outside_itself() -> None:
    core = files("orchestrator/core")
    assert core, "no core found"
    assert violations(core, core_rule) == []


@pytest.mark.parametrize(
    "room", ["common", "gateway", "sim", "bench", "cli.py"], ids=lambda r: r.removesuffix(".py")
)
def test_applications_use_the_core_through_its_seams(room: str) -> None:
    target = ROOT / "orchestrator" / room
    paths = [target] if target.is_file() else files(f"orchestrator/{room}")
    assert violations(paths, app_rule(room == "gateway")) == []


@pytest.mark.parametrize(("folder", "room"), ROOMS.items(), ids=list(ROOMS))
def test_each_room_imports_only_itself_the_seams_and_the_shared_vocabulary(
    folder: str, room: str
) -> None:
    paths = files(folder)
    assert paths, f"no room at {folder}"
    assert violations(paths, room_rule(room)) == []


# Inside plugins: a module (or folder) below another never imports the one above it.
BELOW = [
    # The C++ kernels' wrapper serves the model; the model composes its ops from it.
    ("plugins/torch_executor/native.py", "plugins.torch_executor.model"),
    # LLM-API mode runs the in-executor scheduler, which knows nothing of the mode.
    ("plugins/trtllm/in_executor", "plugins.trtllm.llm_api"),
]


@pytest.mark.parametrize(("lower", "upper"), BELOW, ids=[lower for lower, _ in BELOW])
def test_a_lower_plugin_module_never_imports_the_one_above(lower: str, upper: str) -> None:
    target = ROOT / lower
    paths = [target] if target.is_file() else files(lower)
    assert paths, f"nothing at {lower}"
    found = violations(paths, lambda name: "imports upward" if within(name, upper) else None)
    assert found == []


def test_every_room_of_the_architecture_table_is_checked() -> None:
    table = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_/]+)/` \|", table, re.MULTILINE))
    assert listed == {"orchestrator/core", *ROOMS}


def test_the_rules_catch_what_they_forbid() -> None:
    # The checks themselves: each rule refuses what it names.
    assert core_rule("torch") and core_rule("numpy") and core_rule("fastapi")
    assert core_rule("orchestrator.common.specs") and core_rule("plugins.sim_executor")
    assert app_rule(False)("plugins.sim_executor")
    assert app_rule(False)("orchestrator.core.sched.scheduler")
    assert app_rule(False)("fastapi") and not app_rule(True)("fastapi")
    plugins = room_rule("plugins")
    assert plugins("orchestrator.sim.driver") and plugins("build_engines.manifest")
    assert plugins("orchestrator.core.config") and not plugins("orchestrator.core")
    assert not plugins("orchestrator.common.build_manifest") and not plugins("plugins.trtllm")
    assert room_rule("build_engines")("plugins.trtllm.settings")
    assert room_rule("orchestrator.sim")("orchestrator.bench.client")
