"""The model folder a Dynamo worker registers: what Dynamo's frontend loads to tokenise
prompts, render chat templates and detokenise our token ids.

Dynamo's model card reads a Hugging Face layout: ``config.json`` whose
``architectures`` is a list, ``tokenizer.json``, and ``tokenizer_config.json`` carrying
the chat template (recent transformers write the template to ``chat_template.jinja``
instead, which the frontend does not read). Our models may be a GGUF file (the embedded
default) with none of these, so the worker writes them from the same tokenizer and
config the gateway loads, once per model source, into a cache folder.

transformers is imported inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.core import ModelConfig

REQUIRED_FILES: tuple[str, ...] = ("config.json", "tokenizer.json", "tokenizer_config.json")

# Keys of a transformers config dict that describe where it was loaded from on this
# machine: not part of the model, and a local path leaks into every replica's card.
_LOCAL_KEYS = ("_name_or_path", "_model_name_or_path", "transformers_version")


class ModelFolderError(ValueError):
    """The model's tokenizer or config cannot be written as a Hugging Face folder; the
    message says what is missing."""


def default_cache_root() -> Path:
    """Where model folders are kept: ``$XDG_CACHE_HOME/orchestrator/dynamo-models``
    (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orchestrator" / "dynamo-models"


def folder_key(model: ModelConfig) -> str:
    """A file-name-safe key for one model source (and revision): equal configs share a
    folder, so every worker of one model registers the same files."""
    material = json.dumps([model.source, model.revision, model.name]).encode()
    safe_name = "".join(c if c.isalnum() or c in "-_." else "-" for c in model.name)
    return f"{safe_name}-{hashlib.sha256(material).hexdigest()[:12]}"


def config_json(config: Mapping[str, Any], architectures: Sequence[str]) -> dict[str, Any]:
    """``config.json``'s content: ``config`` (a transformers config as a dict) without
    machine-local keys, with ``architectures`` a list (Dynamo refuses anything else)."""
    if not architectures:
        raise ModelFolderError("config.json needs at least one architecture")
    out = {k: v for k, v in config.items() if k not in _LOCAL_KEYS}
    out["architectures"] = list(architectures)
    return out


def tokenizer_config_json(
    tokenizer_config: Mapping[str, Any], chat_template: str | None
) -> dict[str, Any]:
    """``tokenizer_config.json``'s content with the chat template inline (where the
    frontend looks for it). ``ModelFolderError`` when the model has no chat template:
    a chat request could then not be rendered."""
    if not chat_template:
        raise ModelFolderError(
            "the model's tokenizer has no chat template; Dynamo's frontend needs one "
            "in tokenizer_config.json to serve chat completions"
        )
    out = dict(tokenizer_config)
    out["chat_template"] = chat_template
    return out


def _architectures(hf_config: Any) -> list[str]:
    """The config's own architectures, else the causal-LM class transformers maps its
    ``model_type`` to (a GGUF file records only the model type)."""
    if hf_config.architectures:
        return list(hf_config.architectures)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(hf_config.model_type)
    if name is None:
        raise ModelFolderError(
            f"model type {hf_config.model_type!r} has no causal-LM class in transformers"
        )
    return [name]


def _chat_template(tokenizer: Any, saved: Path) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        return template
    jinja = saved / "chat_template.jinja"
    return jinja.read_text() if jinja.exists() else None


def write_model_folder(model: ModelConfig, target: Path) -> Path:
    """Write ``model``'s Hugging Face folder to ``target`` (replaced whole, atomically,
    so workers starting together never read a half-written folder) and return it."""
    from transformers import AutoConfig

    from orchestrator.common.model_source import load_tokenizer, resolve_source

    tokenizer = load_tokenizer(model)
    source = resolve_source(model)
    if source.gguf_file is not None:
        hf_config = AutoConfig.from_pretrained(source.directory, gguf_file=source.gguf_file)
    else:
        hf_config = AutoConfig.from_pretrained(source.directory)

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer.save_pretrained(staging)
        tok_config_path = staging / "tokenizer_config.json"
        tok_config = json.loads(tok_config_path.read_text())
        tok_config = tokenizer_config_json(tok_config, _chat_template(tokenizer, staging))
        tok_config_path.write_text(json.dumps(tok_config, indent=2))
        content = config_json(hf_config.to_dict(), _architectures(hf_config))
        (staging / "config.json").write_text(json.dumps(content, indent=2))
        missing = [name for name in REQUIRED_FILES if not (staging / name).exists()]
        if missing:
            raise ModelFolderError(f"the tokenizer did not write {', '.join(missing)}")
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}-old-{os.getpid()}")
            target.rename(old)
        staging.rename(target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def ensure_model_folder(model: ModelConfig, root: Path | None = None) -> Path:
    """The model's folder under ``root`` (``default_cache_root()``), written on first
    use; a folder already holding every required file is reused as it is."""
    target = (root or default_cache_root()) / folder_key(model)
    if all((target / name).exists() for name in REQUIRED_FILES):
        return target
    return write_model_folder(model, target)
