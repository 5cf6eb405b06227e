"""The manifest a TensorRT-LLM build writes next to its artefact: the record the build
pipeline (``build_engines``) writes and the TensorRT-LLM executors (``plugins/trtllm``)
read, so it lives in the shared vocabulary both may import.

It records how the artefact was made (spec, spec hash, tool versions, GPU, command lines,
timings, verification) and, in ``serving``, the settings the serving side configures its
executor from, so the scheduler never admits more than the engine was built for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from orchestrator.core import ConfigError, StrictModel, format_errors

Backend = Literal["engine", "pytorch"]
KVCacheDType = Literal["fp8", "int8", "bf16", "fp16"]


class Verification(StrictModel):
    """The outcome of comparing the artefact with the spec. ``checked`` lists the dotted
    keys (or files) compared; ``differences`` one line per mismatch."""

    passed: bool
    checked: list[str]
    differences: list[str]


MANIFEST_VERSION = 1


class StepRecord(StrictModel):
    """One pipeline step: ``ran`` or ``skipped`` (output up to date), wall seconds,
    the command it ran (``None`` for in-process steps) and its log file."""

    name: str
    status: Literal["ran", "skipped"]
    seconds: float = Field(ge=0)
    command: list[str] | None = None
    log: str | None = None


class ServingSettings(StrictModel):
    """What the executor needs: limits in tokens/sequences, the KV block size in tokens,
    the KV cache dtype, the parallel layout and where the artefact and its LLM-API options
    file are."""

    backend: Backend
    artifact_dir: str
    llm_api_options: str
    max_batch_size: int
    max_num_tokens: int
    max_input_len: int
    max_seq_len: int
    tokens_per_block: int
    kv_cache_dtype: KVCacheDType
    tp: int
    pp: int


class Manifest(StrictModel):
    format_version: int = MANIFEST_VERSION
    name: str
    spec: dict[str, Any]
    spec_hash: str
    created_at: str
    source_revision: str | None
    tool_versions: dict[str, str | None]
    gpu_name: str | None
    steps: list[StepRecord]
    llm_api_options: dict[str, Any]
    verification: Verification
    serving: ServingSettings


def write_manifest(manifest: Manifest, path: Path) -> None:
    """Write ``manifest`` as indented JSON, atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
    tmp.replace(path)


def load_manifest(path: str | Path, *, require_verified: bool = True) -> Manifest:
    """Read a manifest; errors name the file and the key. With ``require_verified`` (what
    a server wants) a manifest whose artefact failed verification is refused."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read manifest: {err.strerror}") from None
    try:
        manifest = Manifest.model_validate_json(text)
    except ValidationError as err:
        raise ConfigError(f"{path}: {format_errors(err)}") from None
    if manifest.format_version != MANIFEST_VERSION:
        raise ConfigError(
            f"{path}: format_version: {manifest.format_version} is not supported "
            f"(expected {MANIFEST_VERSION})"
        )
    if require_verified and not manifest.verification.passed:
        raise ConfigError(
            f"{path}: verification: the artefact failed verification ("
            + "; ".join(manifest.verification.differences)
            + "); rebuild it"
        )
    return manifest
