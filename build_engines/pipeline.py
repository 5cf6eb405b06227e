"""The build pipeline: download -> quantise -> build -> verify, then the LLM-API options
file and the manifest.

Each of the first three steps has an input hash over exactly the spec fields it depends
on (and the hash of the step before it). A finished step leaves a stamp holding that
hash under ``<output>/.steps/``; a later run skips the step when the stamp matches and
its output still exists, so an interrupted or re-tuned build resumes where it can (a new
``max_batch_size`` rebuilds the engine but keeps the 40-minute quantisation).
``force`` ignores the stamps. Verification always runs: it only reads a few files.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import yaml

from build_engines.commands import Layout, artifact_dir, llm_api_options, source_dir
from build_engines.environment import Environment
from build_engines.errors import BuildError, VerificationError
from build_engines.plan import BuildPlan
from build_engines.runners import Runners
from build_engines.spec import BuildSpec, content_hash
from orchestrator.common.build_manifest import (
    Manifest,
    ServingSettings,
    StepRecord,
    write_manifest,
)

VERIFY_STEP = "verify"


class StepReporter(Protocol):
    """Receives progress: each step is started then finished or failed, or skipped."""

    def started(self, step: str, detail: str) -> None: ...

    def skipped(self, step: str, reason: str) -> None: ...

    def finished(self, step: str, seconds: float) -> None: ...

    def failed(self, step: str, error: str) -> None: ...


class NullReporter:
    """A reporter that shows nothing."""

    def started(self, step: str, detail: str) -> None:
        pass

    def skipped(self, step: str, reason: str) -> None:
        pass

    def finished(self, step: str, seconds: float) -> None:
        pass

    def failed(self, step: str, error: str) -> None:
        pass


def step_names(plan: BuildPlan) -> list[str]:
    """The steps a run of ``plan`` reports, in order."""
    build = ["build"] if plan.build_argv is not None else []
    return ["download", "quantize", *build, VERIFY_STEP]


@dataclass(frozen=True)
class Step:
    """``action`` does the work and returns facts to keep in the stamp (e.g. the commit
    a download resolved to). ``clean``: empty ``output`` first, so files of an earlier
    build (rank files of another TP size) cannot survive into this one."""

    name: str
    detail: str
    input_hash: str
    output: Path
    command: list[str] | None
    log: Path | None
    clean: bool
    action: Callable[[], dict[str, Any]]


def step_hashes(spec: BuildSpec) -> dict[str, str]:
    """Input hash of each resumable step: the spec fields it reads, chained to the hash of
    the step before it."""
    data = spec.model_dump(mode="json")
    download = content_hash({"source": spec.model.source, "revision": spec.model.revision})
    quantize_inputs: dict[str, Any] = {
        "after": download,
        "backend": spec.backend,
        "dtype": spec.model.dtype,
        "quantization": data["quantization"],
    }
    if spec.backend == "engine":  # the TensorRT-LLM checkpoint is sharded for TP and PP
        quantize_inputs["parallelism"] = data["parallelism"]
    quantize = content_hash(quantize_inputs)
    build = content_hash(
        {
            "after": quantize,
            "limits": data["limits"],
            "parallelism": data["parallelism"],
            "plugins": spec.engine_plugins.model_dump(mode="json"),
            "target": data["target"],
        }
    )
    return {"download": download, "quantize": quantize, "build": build}


class Stamps:
    """The ``.steps/<name>.json`` files of one output directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, step: str) -> Path:
        return self.directory / f"{step}.json"

    def read(self, step: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._path(step).read_text())
        except (OSError, json.JSONDecodeError):
            return None  # no stamp, or a torn one: the step simply runs again
        return data if isinstance(data, dict) else None

    def write(self, step: str, data: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self._path(step).with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self._path(step))

    def clear(self, step: str) -> None:
        self._path(step).unlink(missing_ok=True)


class BuildPipeline:
    """Runs a plan with the given runners, reporting to ``reporter``.

    ``clock`` (seconds, monotonic) times the steps; ``now`` stamps the manifest.
    The plan must be free of validation errors.
    """

    def __init__(
        self,
        plan: BuildPlan,
        runners: Runners,
        reporter: StepReporter,
        environment: Environment,
        *,
        force: bool = False,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if plan.errors:
            raise ValueError(f"plan has {len(plan.errors)} validation errors")
        self.plan = plan
        self.runners = runners
        self.reporter = reporter
        self.environment = environment
        self.force = force
        self.clock = clock
        self.now = now
        self.stamps = Stamps(plan.layout.stamps_dir)

    @property
    def layout(self) -> Layout:
        return self.plan.layout

    def steps(self) -> list[Step]:
        spec, layout, hashes = self.plan.spec, self.layout, step_hashes(self.plan.spec)
        logs = layout.logs_dir

        def download() -> dict[str, Any]:
            result = self.runners.download(spec.model, layout.hf_dir)
            return {"revision": result.revision}

        def quantize() -> dict[str, Any]:
            self.runners.quantize(self.plan.quantize_argv, logs / "quantize.log")
            return {}

        steps = [
            Step(
                "download",
                self.plan.download,
                hashes["download"],
                source_dir(spec, layout),
                None,
                None,
                False,
                download,
            ),
            Step(
                "quantize",
                " ".join(self.plan.quantize_argv),
                hashes["quantize"],
                layout.checkpoint_dir,
                self.plan.quantize_argv,
                logs / "quantize.log",
                True,
                quantize,
            ),
        ]
        build_argv = self.plan.build_argv
        if build_argv is not None:

            def build() -> dict[str, Any]:
                self.runners.build(build_argv, logs / "build.log")
                return {}

            steps.append(
                Step(
                    "build",
                    " ".join(build_argv),
                    hashes["build"],
                    layout.engine_dir,
                    build_argv,
                    logs / "build.log",
                    True,
                    build,
                )
            )
        return steps

    def is_up_to_date(self, step: Step) -> bool:
        """Whether ``step`` would be skipped: a matching stamp and its output present."""
        if self.force:
            return False
        stamp = self.stamps.read(step.name)
        return stamp is not None and stamp.get("hash") == step.input_hash and step.output.exists()

    def preview(self) -> list[tuple[Step, bool]]:
        """Each step and whether it is up to date (``--dry-run``); runs nothing."""
        return [(step, self.is_up_to_date(step)) for step in self.steps()]

    def _run_step(self, step: Step) -> tuple[StepRecord, dict[str, Any]]:
        log = str(step.log) if step.log else None
        if self.is_up_to_date(step):
            stamp = self.stamps.read(step.name) or {}
            self.reporter.skipped(step.name, "output up to date (same input hash)")
            record = StepRecord(
                name=step.name, status="skipped", seconds=0.0, command=step.command, log=log
            )
            return record, dict(stamp.get("facts", {}))
        self.stamps.clear(step.name)
        if step.clean and step.output.exists():
            shutil.rmtree(step.output)
        self.reporter.started(step.name, step.detail)
        start = self.clock()
        try:
            facts = step.action()
        except BuildError as err:
            self.reporter.failed(step.name, str(err))
            raise
        seconds = self.clock() - start
        self.stamps.write(step.name, {"hash": step.input_hash, "facts": facts})
        self.reporter.finished(step.name, seconds)
        record = StepRecord(
            name=step.name, status="ran", seconds=seconds, command=step.command, log=log
        )
        return record, facts

    def run(self) -> Manifest:
        """Run every step that is not up to date, verify, and write the options file and
        the manifest. Raises ``BuildError`` when a step fails and ``VerificationError``
        (after writing the manifest) when the artefact differs from the spec."""
        spec, layout = self.plan.spec, self.layout
        layout.root.mkdir(parents=True, exist_ok=True)
        records, facts = [], {}
        for step in self.steps():
            record, facts[step.name] = self._run_step(step)
            records.append(record)

        self.reporter.started(VERIFY_STEP, f"compare {artifact_dir(spec, layout)} with the spec")
        start = self.clock()
        verification = self.runners.verify(spec, layout)
        seconds = self.clock() - start
        records.append(StepRecord(name=VERIFY_STEP, status="ran", seconds=seconds))

        options = llm_api_options(spec)
        layout.options_path.write_text(
            yaml.safe_dump(options, sort_keys=False, default_flow_style=None)
        )
        manifest = Manifest(
            name=spec.name,
            spec=spec.model_dump(mode="json"),
            spec_hash=spec.spec_hash,
            created_at=self.now().isoformat(timespec="seconds"),
            source_revision=facts["download"].get("revision"),
            tool_versions=self.environment.tool_versions,
            gpu_name=self.environment.gpu_name,
            steps=records,
            llm_api_options=options,
            verification=verification,
            serving=serving_settings(spec, layout),
        )
        write_manifest(manifest, layout.manifest_path)
        if not verification.passed:
            self.reporter.failed(VERIFY_STEP, "; ".join(verification.differences))
            raise VerificationError(
                f"{artifact_dir(spec, layout)} does not match the spec:\n  "
                + "\n  ".join(verification.differences)
            )
        self.reporter.finished(VERIFY_STEP, seconds)
        return manifest


def serving_settings(spec: BuildSpec, layout: Layout) -> ServingSettings:
    lim = spec.limits
    return ServingSettings(
        backend=spec.backend,
        artifact_dir=str(artifact_dir(spec, layout)),
        llm_api_options=str(layout.options_path),
        max_batch_size=lim.max_batch_size,
        max_num_tokens=lim.max_num_tokens,
        max_input_len=lim.max_input_len,
        max_seq_len=lim.max_seq_len,
        tokens_per_block=lim.tokens_per_block,
        kv_cache_dtype=spec.quantization.kv_cache,
        tp=spec.parallelism.tp,
        pp=spec.parallelism.pp,
    )
