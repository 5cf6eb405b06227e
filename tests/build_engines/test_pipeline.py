"""The pipeline with fake tools: step order, resumability, failures, the manifest."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from build_engines.errors import BuildError, VerificationError
from build_engines.pipeline import BuildPipeline, step_hashes, step_names
from orchestrator.common.build_manifest import load_manifest
from tests.build_engines.helpers import (
    COMMIT,
    PYTORCH,
    FakeTools,
    RecordingReporter,
    TickClock,
    make_spec,
    plan_for,
    ready_environment,
)


def run(
    tmp_path: Path,
    tools: FakeTools,
    *overrides: dict[str, Any],
    force: bool = False,
    reporter: RecordingReporter | None = None,
) -> Any:
    plan = plan_for(make_spec(*overrides), tmp_path)
    pipeline = BuildPipeline(
        plan,
        tools.runners(),
        reporter or RecordingReporter(),
        ready_environment(),
        force=force,
        clock=TickClock(),
        now=lambda: datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    )
    return pipeline.run()


def test_first_run_runs_every_step_in_order(tmp_path: Path) -> None:
    tools, reporter = FakeTools(), RecordingReporter()
    manifest = run(tmp_path, tools, reporter=reporter)
    assert tools.calls == ["download", "quantize", "build"]
    assert reporter.events == [
        ("started", "download"),
        ("finished", "download"),
        ("started", "quantize"),
        ("finished", "quantize"),
        ("started", "build"),
        ("finished", "build"),
        ("started", "verify"),
        ("finished", "verify"),
    ]
    assert [s.status for s in manifest.steps] == ["ran"] * 4
    assert manifest.verification.passed


def test_second_run_skips_every_step(tmp_path: Path) -> None:
    tools = FakeTools()
    run(tmp_path, tools)
    reporter = RecordingReporter()
    manifest = run(tmp_path, tools, reporter=reporter)
    assert tools.calls == ["download", "quantize", "build"]  # nothing ran again
    assert [e for e in reporter.events if e[0] == "skipped"] == [
        ("skipped", "download"),
        ("skipped", "quantize"),
        ("skipped", "build"),
    ]
    assert [s.status for s in manifest.steps] == ["skipped"] * 3 + ["ran"]
    # The commit the first run resolved is still known when the download is skipped.
    assert manifest.source_revision == COMMIT


def test_force_reruns_every_step(tmp_path: Path) -> None:
    tools = FakeTools()
    run(tmp_path, tools)
    run(tmp_path, tools, force=True)
    assert tools.calls == ["download", "quantize", "build"] * 2


def test_new_limits_rebuild_the_engine_but_keep_the_checkpoint(tmp_path: Path) -> None:
    tools = FakeTools()
    run(tmp_path, tools)
    manifest = run(tmp_path, tools, {"limits": {"max_batch_size": 32}})
    assert tools.calls == ["download", "quantize", "build", "build"]
    assert manifest.serving.max_batch_size == 32
    assert manifest.verification.passed


def test_new_quantization_requantises_and_rebuilds(tmp_path: Path) -> None:
    tools = FakeTools()
    run(tmp_path, tools)
    run(tmp_path, tools, {"quantization": {"calib_size": 256}})
    assert tools.calls == ["download", "quantize", "build", "quantize", "build"]


def test_step_hashes_depend_only_on_their_inputs() -> None:
    base = step_hashes(make_spec())
    runtime = step_hashes(make_spec({"runtime": {"enable_block_reuse": False}}))
    assert runtime == base  # run-time settings need no rebuild
    limits = step_hashes(make_spec({"limits": {"max_num_tokens": 4096}}))
    assert limits["quantize"] == base["quantize"] and limits["build"] != base["build"]
    source = step_hashes(make_spec({"model": {"revision": "f" * 40}}))
    assert all(source[k] != base[k] for k in base)  # a new download invalidates all


def test_deleted_output_reruns_its_step(tmp_path: Path) -> None:
    tools = FakeTools()
    manifest = run(tmp_path, tools)
    engine_dir = Path(manifest.serving.artifact_dir)
    for f in engine_dir.iterdir():
        f.unlink()
    engine_dir.rmdir()
    run(tmp_path, tools)
    assert tools.calls == ["download", "quantize", "build", "build"]


def test_failed_step_stops_and_reruns_next_time(tmp_path: Path) -> None:
    tools, reporter = FakeTools(), RecordingReporter()
    tools.fail = "quantize"
    with pytest.raises(BuildError, match="quantize exited"):
        run(tmp_path, tools, reporter=reporter)
    assert reporter.events[-1] == ("failed", "quantize")
    assert not (tmp_path / "out" / "manifest.json").exists()
    tools.fail = None
    run(tmp_path, tools)
    # The download was kept; the failed quantisation ran again.
    assert tools.calls == ["download", "quantize", "quantize", "build"]


def test_silent_override_fails_verification_and_is_named(tmp_path: Path) -> None:
    tools, reporter = FakeTools(), RecordingReporter()
    # Play a trtllm-build that drops reduce_fusion without telling anyone.
    tools.engine_overrides = {"plugin_config.reduce_fusion": False}
    with pytest.raises(VerificationError, match=r"plugin_config\.reduce_fusion: asked True"):
        run(tmp_path, tools, reporter=reporter)
    assert reporter.events[-1] == ("failed", "verify")
    manifest = load_manifest(tmp_path / "out" / "manifest.json", require_verified=False)
    assert not manifest.verification.passed


def test_manifest_records_the_build(tmp_path: Path) -> None:
    manifest = run(tmp_path, FakeTools())
    out = tmp_path / "out"
    assert manifest == load_manifest(out / "manifest.json")
    assert manifest.spec_hash == make_spec().spec_hash
    assert manifest.created_at == "2025-01-02T03:04:05+00:00"
    assert manifest.gpu_name == "NVIDIA H100 80GB HBM3"
    assert manifest.tool_versions["tensorrt_llm"] == "1.2.0"
    assert manifest.source_revision == COMMIT
    by_name = {s.name: s for s in manifest.steps}
    assert by_name["build"].command is not None and by_name["build"].command[0] == "trtllm-build"
    assert by_name["quantize"].log == str(out / "logs" / "quantize.log")
    assert by_name["build"].seconds == pytest.approx(1.5)  # one tick of the fake clock
    serving = manifest.serving
    assert (serving.max_batch_size, serving.max_num_tokens, serving.tokens_per_block) == (
        48,
        8192,
        32,
    )
    assert (serving.kv_cache_dtype, serving.tp, serving.pp) == ("fp8", 2, 1)
    assert serving.artifact_dir == str(out / "engine")
    options = yaml.safe_load((out / "llm_api_options.yaml").read_text())
    assert options == manifest.llm_api_options
    assert options["extended_runtime_perf_knob_config"] == {
        "cuda_graph_mode": True,
        "cuda_graph_cache_size": 64,
    }


def test_pytorch_backend_has_no_build_step(tmp_path: Path) -> None:
    tools = FakeTools()
    manifest = run(tmp_path, tools, PYTORCH)
    assert tools.calls == ["download", "quantize"]
    assert [s.name for s in manifest.steps] == ["download", "quantize", "verify"]
    assert manifest.verification.passed
    assert manifest.serving.artifact_dir == str(tmp_path / "out" / "checkpoint")
    assert manifest.llm_api_options["cuda_graph_config"]["batch_sizes"] == [1, 8, 32]
    assert step_names(plan_for(make_spec(PYTORCH), tmp_path)) == [
        "download",
        "quantize",
        "verify",
    ]


def test_preview_reports_up_to_date_steps(tmp_path: Path) -> None:
    tools = FakeTools()
    plan = plan_for(make_spec(), tmp_path)
    pipeline = BuildPipeline(plan, tools.runners(), RecordingReporter(), ready_environment())
    assert [(s.name, up) for s, up in pipeline.preview()] == [
        ("download", False),
        ("quantize", False),
        ("build", False),
    ]
    pipeline.run()
    assert all(up for _, up in pipeline.preview())
    assert tools.calls == ["download", "quantize", "build"]  # preview ran nothing


def test_refuses_a_plan_with_errors(tmp_path: Path) -> None:
    plan = plan_for(make_spec({"parallelism": {"tp": 3}}), tmp_path)
    with pytest.raises(ValueError, match="validation errors"):
        BuildPipeline(plan, FakeTools().runners(), RecordingReporter(), ready_environment())
