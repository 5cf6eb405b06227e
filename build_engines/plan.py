"""A build plan: the spec with everything derived from it before anything runs
(validation findings, capacity plan, output layout, exact commands)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from build_engines.commands import (
    Layout,
    Toolchain,
    build_argv,
    describe_download,
    quantize_argv,
)
from build_engines.environment import BackendChoice
from build_engines.memory import BuildCapacity, plan_memory
from build_engines.spec import BuildSpec, load_build_spec
from build_engines.validate import Finding, RuleInput, Severity, validate
from orchestrator.common.specs import GPUSpec, ModelSpec


@dataclass(frozen=True)
class BuildPlan:
    spec: BuildSpec
    model: ModelSpec
    gpu: GPUSpec
    toolchain: Toolchain
    layout: Layout
    memory: BuildCapacity
    findings: tuple[Finding, ...]
    spec_path: Path | None = None
    backend_note: str | None = None  # why the backend is what it is, when the spec left it

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.WARNING]

    @property
    def download(self) -> str:
        return describe_download(self.spec, self.layout)

    @property
    def quantize_argv(self) -> list[str]:
        return quantize_argv(self.spec, self.layout, self.toolchain)

    @property
    def build_argv(self) -> list[str] | None:
        """``trtllm-build`` command, or ``None`` for the PyTorch backend (no engine)."""
        if self.spec.backend != "engine":
            return None
        return build_argv(self.spec, self.layout, self.toolchain)


def make_plan(
    spec: BuildSpec,
    model: ModelSpec,
    gpu: GPUSpec,
    toolchain: Toolchain,
    *,
    cwd: Path | None = None,
    spec_path: Path | None = None,
) -> BuildPlan:
    """Plan ``spec``; a relative ``output_dir`` is taken from ``cwd`` (default: the
    current directory)."""
    root = spec.output_dir.expanduser()
    if not root.is_absolute():
        root = (cwd or Path.cwd()) / root
    memory = plan_memory(spec, model, gpu)
    findings = validate(RuleInput(spec, model, gpu, memory))
    return BuildPlan(spec, model, gpu, toolchain, Layout(root), memory, tuple(findings), spec_path)


def plan_from_file(
    path: str | Path,
    toolchain: Toolchain,
    *,
    cwd: Path | None = None,
    backend: BackendChoice | None = None,
) -> BuildPlan:
    """Load the spec at ``path`` (raises ``ConfigError``) and plan it; a spec without
    ``backend`` takes ``backend`` (default: engine) and the plan says why."""
    choice = backend or BackendChoice("engine", "engine assumed")
    loaded = load_build_spec(path, default_backend=choice.backend)
    plan = make_plan(
        loaded.spec, loaded.model, loaded.gpu, toolchain, cwd=cwd, spec_path=loaded.path
    )
    if loaded.backend_given:
        return plan
    return replace(plan, backend_note=f"default: {choice.reason}")
