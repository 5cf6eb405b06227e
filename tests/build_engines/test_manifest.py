"""The manifest round-trips, and bad or unverified manifests are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.common.build_manifest import (
    Manifest,
    ServingSettings,
    StepRecord,
    Verification,
    load_manifest,
    write_manifest,
)
from orchestrator.core.config import ConfigError
from tests.build_engines.helpers import make_spec


def sample(passed: bool = True) -> Manifest:
    spec = make_spec()
    return Manifest(
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        spec_hash=spec.spec_hash,
        created_at="2025-01-02T03:04:05+00:00",
        source_revision="a" * 40,
        tool_versions={"tensorrt_llm": "1.2.0", "modelopt": None},
        gpu_name="NVIDIA H100 80GB HBM3",
        steps=[
            StepRecord(name="download", status="skipped", seconds=0.0),
            StepRecord(
                name="build",
                status="ran",
                seconds=1834.2,
                command=["trtllm-build", "--workers", "2"],
                log="/x/logs/build.log",
            ),
        ],
        llm_api_options={
            "enable_chunked_prefill": True,
            "kv_cache_config": {"enable_block_reuse": True},
        },
        verification=Verification(
            passed=passed,
            checked=["build_config.max_batch_size"],
            differences=[] if passed else ["x: asked 1, config.json has 2"],
        ),
        serving=ServingSettings(
            backend="engine",
            artifact_dir="/x/engine",
            llm_api_options="/x/llm_api_options.yaml",
            max_batch_size=48,
            max_num_tokens=8192,
            max_input_len=8192,
            max_seq_len=8192,
            tokens_per_block=32,
            kv_cache_dtype="fp8",
            tp=2,
            pp=1,
        ),
    )


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    manifest = sample()
    write_manifest(manifest, path)
    assert load_manifest(path) == manifest
    assert not path.with_name("manifest.json.tmp").exists()


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    data = sample().model_dump(mode="json")
    data["serving"]["max_batch"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"{path}: serving.max_batch: unknown key"):
        load_manifest(path)


def test_unverified_artifact_is_refused_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    write_manifest(sample(passed=False), path)
    with pytest.raises(ConfigError, match=r"failed verification .*x: asked 1"):
        load_manifest(path)
    assert not load_manifest(path, require_verified=False).verification.passed


def test_unsupported_version(tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    data = sample().model_dump(mode="json")
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="format_version: 99 is not supported"):
        load_manifest(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read manifest"):
        load_manifest(tmp_path / "manifest.json")
