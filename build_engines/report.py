"""Terminal output with ``rich``: the plan (summary, validation, memory table, commands,
run-time options) and a per-step progress display."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import yaml
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from build_engines.commands import llm_api_options, shell
from build_engines.plan import BuildPlan
from build_engines.validate import Severity

GB = 1e9


def _gb(n: float) -> str:
    return f"{n / GB:,.2f} GB"


def render_summary(console: Console, plan: BuildPlan) -> None:
    s = plan.spec
    q, par = s.quantization, s.parallelism
    revision = f"@{s.model.revision}" if s.model.revision else ""
    table = Table(title=f"Build plan: {s.name}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    note = f" ({plan.backend_note})" if plan.backend_note else ""
    table.add_row("Backend", f"{s.backend}{note}")
    table.add_row("Model", f"{s.model.source}{revision} ({plan.model.name}, {s.model.dtype})")
    table.add_row("Quantisation", f"weights {q.weights}, KV cache {q.kv_cache}")
    table.add_row("Parallelism", f"tp={par.tp} pp={par.pp} ({par.world_size} GPUs)")
    table.add_row("Target GPU", plan.gpu.name)
    table.add_row("Output", str(plan.layout.root))
    table.add_row("Spec hash", s.spec_hash[:16])
    console.print(table)


def render_validation(console: Console, plan: BuildPlan) -> None:
    errors, warnings = plan.errors, plan.warnings
    if not plan.findings:
        console.print("[bold green]Validation: passed[/] (no errors, no warnings)")
        return
    verdict = "[bold red]failed[/]" if errors else "[bold green]passed[/]"
    console.print(f"Validation: {verdict} ({len(errors)} errors, {len(warnings)} warnings)")
    table = Table(show_lines=True)
    table.add_column("Severity")
    table.add_column("Option", overflow="fold")
    table.add_column("Problem")
    table.add_column("Fix")
    for f in plan.findings:
        colour = "red" if f.severity == Severity.ERROR else "yellow"
        table.add_row(f"[{colour}]{f.severity}[/]", f.option, f.message, f.fix)
    console.print(table)


def render_memory(console: Console, plan: BuildPlan) -> None:
    m, s, model = plan.memory, plan.spec, plan.model
    tp, pp = s.parallelism.tp, s.parallelism.pp
    q = s.quantization
    table = Table(title="Memory plan (per GPU)", title_justify="left")
    table.add_column("Quantity")
    table.add_column("Value", justify="right")
    table.add_column("How")
    table.add_row("GPU memory", _gb(m.gpu_memory_bytes), f"{plan.gpu.name} spec")
    table.add_row(
        "Weights",
        _gb(m.weight_bytes),
        f"{q.weights} linear layers / tp {tp}; {s.model.dtype} embedding and LM head "
        f"/ tp {tp}, norms"
        + (f"; {-(-model.num_layers // pp)} layers per PP rank" if pp > 1 else ""),
    )
    table.add_row(
        "Workspace",
        _gb(m.workspace_bytes),
        f"reserve {_gb(m.reserve_bytes)} + activations {_gb(m.activation_bytes)} "
        f"({s.limits.max_num_tokens} tokens) + logits {_gb(m.logits_bytes)}",
    )
    table.add_row("Free after weights and workspace", _gb(m.free_after_weights_bytes), "")
    table.add_row("KV cache", _gb(m.kv_pool_bytes), f"{m.kv_fraction:g} x free")
    table.add_row(
        "KV bytes per token",
        f"{m.kv_bytes_per_token:,} B",
        f"{model.num_layers} layers x 2 x {model.num_kv_heads} KV heads x {model.head_dim} "
        f"x {q.kv_cache} / tp {tp}",
    )
    table.add_row(
        "KV tokens", f"{m.kv_tokens:,}", f"{m.kv_blocks:,} blocks x {m.tokens_per_block} tokens"
    )
    table.add_row(
        f"Sequences at max_seq_len {m.max_seq_len}", f"{m.sequences_at_max_seq_len:,}", ""
    )
    table.add_row(
        f"Sequences at typical context {m.typical_context_len}",
        f"{m.sequences_at_typical_context:,}",
        "",
    )
    table.add_row("max_batch_size", f"{m.max_batch_size:,}", "")
    console.print(table)


def render_commands(console: Console, plan: BuildPlan) -> None:
    console.print("[bold]Commands[/]")
    console.print(f"1. download: {plan.download}", soft_wrap=True, highlight=False)
    console.print(f"2. quantize: {shell(plan.quantize_argv)}", soft_wrap=True, highlight=False)
    build = plan.build_argv
    if build is not None:
        console.print(f"3. build:    {shell(build)}", soft_wrap=True, highlight=False)
    console.print(
        f"then: verify {'engine/config.json' if build else 'the checkpoint'}, write "
        f"{plan.layout.options_path} and {plan.layout.manifest_path}",
        soft_wrap=True,
        highlight=False,
    )
    console.print(f"[bold]Run-time options[/] ({plan.layout.options_path.name})")
    console.print(
        yaml.safe_dump(
            llm_api_options(plan.spec), sort_keys=False, default_flow_style=None
        ).rstrip(),
        highlight=False,
    )


def render_plan(console: Console, plan: BuildPlan) -> None:
    """Everything ``build-engines plan`` prints."""
    render_summary(console, plan)
    render_validation(console, plan)
    render_memory(console, plan)
    render_commands(console, plan)


class RichStepReporter:
    """Progress display: one line per step with its state and elapsed time. Use as a
    context manager around the pipeline run."""

    def __init__(self, console: Console, steps: Sequence[str]) -> None:
        self.console = console
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description:<10}"),
            TextColumn("{task.fields[state]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._tasks: dict[str, TaskID] = {
            name: self._progress.add_task(name, total=1, start=False, state="pending")
            for name in steps
        }

    def __enter__(self) -> RichStepReporter:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def started(self, step: str, detail: str) -> None:
        self._progress.console.print(f"[bold]{step}[/]: {detail}", soft_wrap=True, highlight=False)
        self._progress.start_task(self._tasks[step])
        self._progress.update(self._tasks[step], state="[cyan]running")

    def skipped(self, step: str, reason: str) -> None:
        self._progress.update(self._tasks[step], completed=1, state=f"[dim]skipped: {reason}")

    def finished(self, step: str, seconds: float) -> None:
        task = self._tasks[step]
        self._progress.update(task, completed=1, state=f"[green]done in {seconds:,.1f} s")
        self._progress.stop_task(task)

    def failed(self, step: str, error: str) -> None:
        task = self._tasks[step]
        first_line = error.splitlines()[0] if error else "failed"
        self._progress.update(task, state=f"[red]failed: {first_line}")
        self._progress.stop_task(task)
