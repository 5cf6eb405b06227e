"""What a Dynamo worker reads from a serve config: the engine's sections, and the three
settings of the ``server`` section that still apply when Dynamo's frontend owns HTTP.

The gateway types the whole ``server`` section (``orchestrator.gateway.config``); plug-ins
do not import the gateway, so the worker validates only what it uses and ignores the
rest (host, port, API keys, body limits: the frontend's business).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core import ConfigError, EngineConfig, format_errors, load_engine_config


class WorkerSettings(BaseModel):
    """``max_tokens_limit`` (tokens): the most output tokens one request may ask for
    (``None``: the context only); ``tenant_slo_classes``: a tenant's SLO class when the
    request names none; ``drain_timeout_s`` (seconds): how long shutdown waits for
    requests in flight. Same meaning as in ``server`` for ``orchestrator serve``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    max_tokens_limit: int | None = Field(None, ge=1)
    tenant_slo_classes: dict[str, str] = Field(default_factory=dict)
    drain_timeout_s: float = Field(30.0, ge=0)


def load_worker_config(path: str | Path) -> tuple[EngineConfig, WorkerSettings]:
    """The engine config in ``path`` and its ``server`` settings for a worker;
    ``ConfigError`` names the file and the key."""
    config = load_engine_config(path)
    try:
        settings = WorkerSettings.model_validate(config.server)
    except ValidationError as err:
        raise ConfigError(f"{path}: server: {format_errors(err)}") from None
    classes = config.scheduler.slo_classes
    for tenant, name in settings.tenant_slo_classes.items():
        if name not in classes:
            known = ", ".join(classes) or "none configured"
            raise ConfigError(
                f"{path}: server.tenant_slo_classes: tenant {tenant[:4]}...'s class {name!r} "
                f"is not in scheduler.slo_classes (known: {known})"
            )
    return config, settings
