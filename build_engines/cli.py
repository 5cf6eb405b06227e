"""``build-engines``: plan or run a TensorRT-LLM build from one YAML spec.

    build-engines plan CONFIG                      plan, validation, memory, commands
    build-engines build CONFIG [--dry-run] [--force]

Exit status: 0 success, 1 invalid spec, 2 usage error, 3 this machine cannot build
(TensorRT-LLM or a suitable GPU is missing), 4 a step or the verification failed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from rich.console import Console

from build_engines.commands import Toolchain
from build_engines.environment import (
    Environment,
    default_backend,
    installed_trtllm_version,
    probe,
)
from build_engines.errors import BuildError
from build_engines.pipeline import VERIFY_STEP, BuildPipeline, NullReporter, step_names
from build_engines.plan import BuildPlan, plan_from_file
from build_engines.report import RichStepReporter, render_plan
from build_engines.runners import Runners, default_runners
from orchestrator.core import ConfigError

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_FAILED = 0, 1, 2, 3, 4

NGC_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build-engines", description="Plan and run TensorRT-LLM builds from a YAML spec."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("plan", "print the plan, validation, memory table and commands; run nothing"),
        ("build", "plan, then download, quantise, build and verify"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("config", help="build spec YAML (e.g. configs/build/*.yaml)")
        p.add_argument(
            "--examples-dir",
            help="TensorRT-LLM examples folder (default: $TRTLLM_EXAMPLES_DIR, else the "
            "NGC image's /app/tensorrt_llm/examples)",
        )
        if name == "build":
            p.add_argument(
                "--dry-run", action="store_true", help="show which steps would run; run none"
            )
            p.add_argument(
                "--force", action="store_true", help="rerun every step, even if up to date"
            )
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    console: Console | None = None,
    environment: Callable[[Toolchain], Environment] = probe,
    runners: Runners | None = None,
    trtllm_version: Callable[[], str | None] = installed_trtllm_version,
) -> int:
    """Entry point. ``environment``, ``runners`` and ``trtllm_version`` are parameters so
    tests can stand in for the machine and the tools. A spec without ``backend`` builds
    for the backend the installed TensorRT-LLM supports; the plan says which and why."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage error
        return EXIT_USAGE if exit_.code else EXIT_OK
    console = console or Console()
    toolchain = Toolchain.from_env(args.examples_dir)
    try:
        plan = plan_from_file(args.config, toolchain, backend=default_backend(trtllm_version()))
    except ConfigError as err:
        console.print(f"[bold red]invalid build spec:[/] {err}", highlight=False)
        return EXIT_INVALID
    render_plan(console, plan)
    if plan.errors:
        console.print(
            f"[bold red]{len(plan.errors)} validation error(s): nothing was run.[/]",
            highlight=False,
        )
        return EXIT_INVALID
    if args.command == "plan":
        return EXIT_OK
    return _build(console, plan, environment(toolchain), runners, args.dry_run, args.force)


def _build(
    console: Console,
    plan: BuildPlan,
    env: Environment,
    runners: Runners | None,
    dry_run: bool,
    force: bool,
) -> int:
    missing = env.missing_for(plan.spec, plan.gpu, plan.toolchain)
    if dry_run:
        # The preview needs no tools: it only reads the step stamps.
        runners = runners or default_runners()
        pipeline = BuildPipeline(plan, runners, NullReporter(), env, force=force)
        console.print("[bold]Dry run[/]: nothing is executed")
        for step, up_to_date in pipeline.preview():
            state = "skip (up to date)" if up_to_date else "run"
            console.print(f"  {step.name:<9} {state}", highlight=False)
        console.print(f"  {VERIFY_STEP:<9} run", highlight=False)
        if missing:
            console.print(f"A real build here would stop: missing {'; '.join(missing)}.")
        return EXIT_OK
    if missing:
        console.print("[bold yellow]Stopped after the plan: this machine cannot build.[/]")
        console.print("Missing:", highlight=False)
        for item in missing:
            console.print(f"  - {item}", highlight=False)
        console.print(
            f"Run the build on a host with {plan.gpu.name} GPUs, inside the NGC TensorRT-LLM "
            f"container ({NGC_IMAGE}); see docs/build.md.",
            highlight=False,
        )
        return EXIT_UNAVAILABLE
    try:
        with RichStepReporter(console, step_names(plan)) as reporter:
            pipeline = BuildPipeline(plan, runners or default_runners(), reporter, env, force=force)
            manifest = pipeline.run()
    except BuildError as err:
        console.print(f"[bold red]build failed:[/] {err}", highlight=False)
        return EXIT_FAILED
    console.print(
        f"[bold green]Built and verified[/] ({len(manifest.verification.checked)} settings "
        f"checked). Manifest: {plan.layout.manifest_path}",
        highlight=False,
    )
    return EXIT_OK
