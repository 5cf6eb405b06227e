"""Fake build folders, written through the build pipeline's own functions, for both
backends: an engine's ``config.json`` (or a quantised checkpoint's ``config.json`` and
``hf_quant_config.json``) holds exactly what verification checks, plus the fake model's
knobs, and the manifest is what ``build-engines`` writes for the same spec."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from build_engines.commands import Layout, llm_api_options
from build_engines.pipeline import serving_settings
from build_engines.spec import BuildSpec
from build_engines.verify import (
    expected_checkpoint_quantization,
    expected_engine_config,
    verify_artifact,
)
from orchestrator.common.build_manifest import Manifest, write_manifest
from orchestrator.core.config import (
    CacheConfig,
    EngineConfig,
    ExecutorSpec,
    ModelConfig,
    SchedulerConfig,
)
from plugins.trtllm.config import TrtllmExecutorConfig
from plugins.trtllm.llm_api.config import TrtllmLlmApiConfig


@dataclass(frozen=True)
class FakeBuild:
    """A build's backend, limits (tokens; sequences for ``max_batch_size``), run-time
    section and the fake model's knobs (see tests/trtllm/fake_tensorrt_llm/_engine.py and
    tests/trtllm/fake_llmapi/_llm.py)."""

    backend: str = "engine"
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
    eos_token_id: int = 2
    gpus: int = 8
    stats_delay_ms: float = 20.0  # the fake LLM's statistics delivery delay (real: 200-400)

    def spec(self, root: Path) -> BuildSpec:
        return BuildSpec.model_validate(
            {
                "name": "fake",
                "backend": self.backend,
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
    """Write a build folder (manifest.json + engine/ or checkpoint/) under ``root``;
    returns ``root``."""
    build = build or FakeBuild()
    spec = build.spec(root)
    layout = Layout(root)
    knobs = {
        "vocab_size": build.vocab_size,
        "kv_memory_tokens": build.kv_memory_tokens,
        "iteration_ms": build.iteration_ms,
        "fail_token_id": build.fail_token_id,
    }
    if spec.backend == "engine":
        _write_engine(spec, layout, knobs)
    else:
        knobs |= {
            "eos_token_id": build.eos_token_id,
            "max_position_embeddings": build.max_seq_len,
            "gpus": build.gpus,
            "stats_delay_ms": build.stats_delay_ms,
        }
        _write_checkpoint(spec, layout, knobs)
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
        tool_versions={"tensorrt_llm": "1.2.1"},
        gpu_name=None,
        steps=[],
        llm_api_options=llm_api_options(spec),
        verification=verification,
        serving=serving_settings(spec, layout),
    )
    write_manifest(manifest, layout.manifest_path)
    return root


def _nested(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _write_engine(spec: BuildSpec, layout: Layout, knobs: dict[str, Any]) -> None:
    layout.engine_dir.mkdir(parents=True, exist_ok=True)
    config = _nested(expected_engine_config(spec)) | {"fake": knobs}
    (layout.engine_dir / "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(spec.parallelism.world_size):
        (layout.engine_dir / f"rank{rank}.engine").write_bytes(b"")


def _write_checkpoint(spec: BuildSpec, layout: Layout, knobs: dict[str, Any]) -> None:
    layout.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    (layout.checkpoint_dir / "config.json").write_text(json.dumps({"fake": knobs}, indent=2))
    (layout.checkpoint_dir / "model.safetensors").write_bytes(b"")
    quant = _nested(expected_checkpoint_quantization(spec))
    (layout.checkpoint_dir / "hf_quant_config.json").write_text(json.dumps(quant))


def engine_config(
    options: TrtllmExecutorConfig | TrtllmLlmApiConfig,
    *,
    block_size: int = 16,
    num_blocks: int | None = None,
    **scheduler: Any,
) -> EngineConfig:
    """An engine config for either TensorRT-LLM executor. It is assembled without
    validating the executor section, which would look the type up among the installed
    entry points; every other section is validated."""
    kind = "trtllm" if isinstance(options, TrtllmExecutorConfig) else "trtllm-llmapi"
    return EngineConfig.model_construct(
        model=ModelConfig(name="fake", source="unused"),
        scheduler=SchedulerConfig(**scheduler),
        cache=CacheConfig(block_size=block_size, num_blocks=num_blocks),
        executor=ExecutorSpec.model_construct(type=kind, options=options),
        server={},
    )
