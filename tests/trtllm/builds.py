"""Fake build folders, written through the build pipeline's own functions: the engine's
``config.json`` holds exactly what verification checks (plus the fake model's knobs),
and the manifest is what ``build-engines`` writes for the same spec."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from build_engines.commands import Layout, llm_api_options
from build_engines.manifest import Manifest, write_manifest
from build_engines.pipeline import serving_settings
from build_engines.spec import BuildSpec
from build_engines.verify import expected_engine_config, verify_artifact
from orchestrator.core.config import (
    CacheConfig,
    EngineConfig,
    ExecutorSpec,
    ModelConfig,
    SchedulerConfig,
    ServerConfig,
)
from plugins.trtllm.config import TrtllmExecutorConfig


@dataclass(frozen=True)
class FakeBuild:
    """A build's limits (tokens; sequences for ``max_batch_size``), its run-time section
    and the fake model's knobs (see tests/trtllm/fake_tensorrt_llm/_engine.py)."""

    max_batch_size: int = 8
    max_num_tokens: int = 256
    max_input_len: int = 448
    max_seq_len: int = 512
    tokens_per_block: int = 16
    tp: int = 1
    runtime: dict[str, Any] = field(default_factory=dict)
    vocab_size: int = 512
    kv_memory_tokens: int = 4096
    iteration_ms: float = 1.0
    fail_token_id: int | None = None

    def spec(self, root: Path) -> BuildSpec:
        return BuildSpec.model_validate(
            {
                "name": "fake",
                "model": {"spec": "llama3-8b", "source": "org/model", "revision": "main"},
                "parallelism": {"tp": self.tp},
                "limits": {
                    "max_batch_size": self.max_batch_size,
                    "max_num_tokens": self.max_num_tokens,
                    "max_input_len": self.max_input_len,
                    "max_seq_len": self.max_seq_len,
                    "tokens_per_block": self.tokens_per_block,
                },
                "runtime": self.runtime,
                "target": {"gpu": "h100-sxm"},
                "output_dir": str(root),
            }
        )


def write_build(root: Path, build: FakeBuild | None = None, *, verified: bool = True) -> Path:
    """Write a build folder (manifest.json + engine/) under ``root``; returns ``root``."""
    build = build or FakeBuild()
    spec = build.spec(root)
    layout = Layout(root)
    engine_dir = layout.engine_dir
    engine_dir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {}
    for dotted, value in expected_engine_config(spec).items():
        *parents, leaf = dotted.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    config["fake"] = {
        "vocab_size": build.vocab_size,
        "kv_memory_tokens": build.kv_memory_tokens,
        "iteration_ms": build.iteration_ms,
        "fail_token_id": build.fail_token_id,
    }
    (engine_dir / "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(spec.parallelism.world_size):
        (engine_dir / f"rank{rank}.engine").write_bytes(b"")
    verification = verify_artifact(spec, layout)
    assert verification.passed, verification.differences
    if not verified:
        verification = verification.model_copy(
            update={"passed": False, "differences": ["forced failure"]}
        )
    manifest = Manifest(
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        spec_hash=spec.spec_hash,
        created_at="2025-01-01T00:00:00+00:00",
        source_revision=None,
        tool_versions={"tensorrt_llm": "1.2.0"},
        gpu_name=None,
        steps=[],
        llm_api_options=llm_api_options(spec),
        verification=verification,
        serving=serving_settings(spec, layout),
    )
    write_manifest(manifest, layout.manifest_path)
    return root


def engine_config(
    options: TrtllmExecutorConfig,
    *,
    block_size: int = 16,
    num_blocks: int | None = None,
    **scheduler: Any,
) -> EngineConfig:
    """An engine config for the trtllm executor. It is assembled without validating the
    executor section, which would look ``trtllm`` up among the installed entry points;
    every other section is validated."""
    return EngineConfig.model_construct(
        model=ModelConfig(name="fake", source="unused"),
        scheduler=SchedulerConfig(**scheduler),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks),
        executor=ExecutorSpec.model_construct(type="trtllm", options=options),
        server=ServerConfig(),
    )
