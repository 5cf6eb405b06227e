"""What the executor is started with: the build's manifest, overridden by run-time options.

The manifest (orchestrator/common/build_manifest.py) records the engine's compiled limits and the
run-time settings the build chose; options left at ``None`` keep the build's choice.
Nothing here imports TensorRT-LLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.common.build_manifest import Manifest, load_manifest
from orchestrator.core import ConfigError, EngineConfig
from plugins.trtllm.config import TrtllmExecutorConfig
from plugins.trtllm.names import CAPACITY_SCHEDULER_POLICIES

MANIFEST_NAME = "manifest.json"
ENGINE_CONFIG_NAME = "config.json"


@dataclass(frozen=True)
class EngineSettings:
    """Everything the executor is configured from. Limits are in tokens (sequences for
    ``max_batch_size``); ``tokens_per_block`` is the engine's paged KV block size."""

    engine_path: Path
    tokens_per_block: int
    max_batch_size: int
    max_num_tokens: int
    max_input_len: int
    max_seq_len: int
    world_size: int
    kv_cache_free_gpu_memory_fraction: float
    kv_cache_max_tokens: int | None
    enable_block_reuse: bool
    enable_chunked_context: bool
    cuda_graph_mode: bool
    cuda_graph_cache_size: int
    capacity_scheduler_policy: str
    pad_id: int | None


def load_settings(config: TrtllmExecutorConfig) -> EngineSettings:
    """Read ``config.engine_dir``'s manifest and merge the options into it.

    Raises ``ConfigError`` naming the file and key when the folder holds no verified
    engine-backend manifest, or the engine it names is missing.
    """
    engine_dir = config.engine_dir.expanduser()
    manifest, manifest_path = read_manifest(engine_dir)
    serving = manifest.serving
    if serving.backend != "engine":
        raise ConfigError(
            f"{manifest_path}: serving.backend is {serving.backend!r}; the trtllm executor "
            "runs TensorRT engines (a build with backend: engine); serve a backend: pytorch "
            "build with type: trtllm-llmapi"
        )
    options = manifest.llm_api_options
    policy = config.capacity_scheduler_policy or option(
        options, "scheduler_config.capacity_scheduler_policy", manifest_path
    )
    if policy not in CAPACITY_SCHEDULER_POLICIES:
        raise ConfigError(
            f"{manifest_path}: llm_api_options.scheduler_config.capacity_scheduler_policy: "
            f"{policy!r} is not one of {', '.join(CAPACITY_SCHEDULER_POLICIES)}"
        )
    return EngineSettings(
        engine_path=artifact_path(engine_dir, manifest, manifest_path),
        tokens_per_block=serving.tokens_per_block,
        max_batch_size=serving.max_batch_size,
        max_num_tokens=serving.max_num_tokens,
        max_input_len=serving.max_input_len,
        max_seq_len=serving.max_seq_len,
        world_size=serving.tp * serving.pp,
        kv_cache_free_gpu_memory_fraction=pick(
            config.kv_cache_free_gpu_memory_fraction,
            options,
            "kv_cache_config.free_gpu_memory_fraction",
            manifest_path,
        ),
        kv_cache_max_tokens=config.kv_cache_max_tokens,
        enable_block_reuse=pick(
            config.enable_block_reuse, options, "kv_cache_config.enable_block_reuse", manifest_path
        ),
        enable_chunked_context=pick(
            config.enable_chunked_context, options, "enable_chunked_prefill", manifest_path
        ),
        cuda_graph_mode=pick(
            config.cuda_graph_mode,
            options,
            "extended_runtime_perf_knob_config.cuda_graph_mode",
            manifest_path,
        ),
        cuda_graph_cache_size=pick(
            config.cuda_graph_cache_size,
            options,
            "extended_runtime_perf_knob_config.cuda_graph_cache_size",
            manifest_path,
        ),
        capacity_scheduler_policy=policy,
        pad_id=config.pad_id,
    )


def check_engine_config(settings: EngineSettings, engine: EngineConfig) -> None:
    """Refuse an engine config our scheduler could not honour on this engine: KV blocks
    of another size than the engine's, or more sequences per step than it was built for."""
    if engine.cache.block_size != settings.tokens_per_block:
        raise ConfigError(
            f"cache.block_size is {engine.cache.block_size} but the engine at "
            f"{settings.engine_path} was built with tokens_per_block="
            f"{settings.tokens_per_block}; set cache.block_size: {settings.tokens_per_block}"
        )
    if engine.scheduler.max_batch_size > settings.max_batch_size:
        raise ConfigError(
            f"scheduler.max_batch_size is {engine.scheduler.max_batch_size} but the engine at "
            f"{settings.engine_path} was built for at most {settings.max_batch_size} sequences"
        )


def read_manifest(build_dir: Path) -> tuple[Manifest, Path]:
    """The verified manifest of a build-engines output folder, and its path. Raises
    ``ConfigError`` naming the folder when it holds none."""
    manifest_path = build_dir / MANIFEST_NAME
    if not manifest_path.is_file():
        raise ConfigError(
            f"{build_dir}: no {MANIFEST_NAME}; it must be a build-engines output folder "
            "(the one holding manifest.json and the artefact)"
        )
    return load_manifest(manifest_path), manifest_path


def artifact_path(build_dir: Path, manifest: Manifest, manifest_path: Path) -> Path:
    """The artefact folder (engine, or quantised checkpoint): where the build put it
    relative to ``build_dir`` (so a copied build folder works), else the absolute path
    the build recorded. Both hold a ``config.json``."""
    recorded = Path(manifest.serving.artifact_dir)
    candidates = [build_dir / recorded.name, recorded]
    for candidate in candidates:
        if (candidate / ENGINE_CONFIG_NAME).is_file():
            return candidate
    raise ConfigError(
        f"{manifest_path}: serving.artifact_dir: no {ENGINE_CONFIG_NAME} at "
        + " or ".join(str(c) for c in candidates)
    )


def option(options: dict[str, Any], dotted: str, manifest_path: Path) -> Any:
    """The build's LLM-API option at ``dotted`` (``a.b``); ``ConfigError`` if missing."""
    value: Any = options
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ConfigError(f"{manifest_path}: llm_api_options.{dotted}: missing")
        value = value[part]
    return value


def pick(override: Any, options: dict[str, Any], dotted: str, manifest_path: Path) -> Any:
    """``override`` unless it is ``None``, else the build's option at ``dotted``."""
    return override if override is not None else option(options, dotted, manifest_path)
