"""The gateway's settings: the ``server`` section of a serve config, and the serve
config itself (an engine config plus that section), which ``orchestrator serve`` loads.

The core's ``EngineConfig`` carries ``server`` unread; this module gives it its type and
checks it against the scheduler's SLO classes, so the core knows nothing of HTTP, API
keys or tenants' default classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from orchestrator.core import EngineConfig, StrictModel, load_yaml
from orchestrator.gateway.protocol.shared import PRIORITY_MAX, PRIORITY_MIN

# The tool parsers ``orchestrator.gateway.tool_parsers.TOOL_PARSERS`` holds, by name (a
# test keeps the two equal): config holds names, behaviour the registry.
ToolCallParserName = Literal["hermes"]


class ObjectiveConfig(StrictModel):
    """What an llm-d InferenceObjective (named by a request's
    ``x-llm-d-inference-objective`` header) means on this server.

    ``priority``: the request's priority when its body and ``X-Priority`` give none, on
    this server's scale (lower is served first). An InferenceObjective's
    ``spec.priority`` runs the other way (higher is more critical), so an objective of
    ``spec.priority: 10`` is ``priority: -10`` here. ``slo_class``: the request's SLO
    class when its body and ``X-SLO-Class`` name none (a key of
    ``scheduler.slo_classes``; ``ServeConfig`` checks it exists). ``None`` leaves each as
    it would be without the objective."""

    priority: int | None = Field(None, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    slo_class: str | None = None


class ServerConfig(StrictModel):
    """Gateway settings. API keys come from ``api_keys`` and/or the environment variable
    named by ``api_keys_env`` (comma-separated); with none, auth is off.

    ``default_chat_max_tokens`` (tokens) is the output limit of a chat request that sets
    neither ``max_tokens`` nor ``max_completion_tokens``; ``None`` means the rest of the
    context. ``max_tokens_limit`` (tokens) caps what any choice may ask for on either
    endpoint (a larger value is a 400); ``None`` leaves only the context as the limit. A
    default never exceeds the cap or the room the prompt leaves.

    ``tenant_slo_classes`` maps a tenant (an API key, or the request's ``user`` field
    when auth is off) to the SLO class its requests get when they name none; the
    gateway puts that class on the ``Submission``, and ``ServeConfig`` checks each class
    exists.

    ``tool_call_parser`` names the served model family's tool-call format (vLLM's and
    trtllm-serve's names): how tools are prompted where the chat template cannot, the
    grammar that forces a call, and how calls are read back.

    ``objectives`` maps an llm-d InferenceObjective's name (the
    ``x-llm-d-inference-objective`` header) to the priority and SLO class its requests
    get (``ObjectiveConfig``); a name not listed leaves the request as it was, as llm-d's
    endpoint picker does for an objective it does not know."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: list[str] = Field(default_factory=list)
    api_keys_env: str = "ORCHESTRATOR_API_KEYS"
    drain_timeout_s: float = Field(30.0, ge=0)
    max_body_bytes: int = Field(1_048_576, ge=1024)
    log_prompts: bool = False
    default_chat_max_tokens: int | None = Field(None, ge=1)
    max_tokens_limit: int | None = Field(None, ge=1)
    tenant_slo_classes: dict[str, str] = Field(default_factory=dict)
    tool_call_parser: ToolCallParserName = "hermes"
    objectives: dict[str, ObjectiveConfig] = Field(default_factory=dict)


class ServeConfig(EngineConfig):
    """What ``orchestrator serve`` reads: the engine's sections and ``server``."""

    # The core carries the section unread (``object``, validated as a mapping); here it
    # is the gateway's own model.
    server: ServerConfig = Field(default_factory=ServerConfig)

    @model_validator(mode="after")
    def _tenant_classes_exist(self) -> ServeConfig:
        classes = self.scheduler.slo_classes
        for tenant, name in self.server.tenant_slo_classes.items():
            if name not in classes:
                known = ", ".join(classes) or "none configured"
                raise ValueError(
                    f"server.tenant_slo_classes: tenant {tenant[:4]}...'s class {name!r} is "
                    f"not in scheduler.slo_classes (known: {known})"
                )
        for objective, entry in self.server.objectives.items():
            if entry.slo_class is not None and entry.slo_class not in classes:
                known = ", ".join(classes) or "none configured"
                raise ValueError(
                    f"server.objectives.{objective}.slo_class: {entry.slo_class!r} is not in "
                    f"scheduler.slo_classes (known: {known})"
                )
        return self


def load_serve_config(path: str | Path) -> ServeConfig:
    """Read a serve config; ``ConfigError`` names the file and the key."""
    return load_yaml(path, ServeConfig)
