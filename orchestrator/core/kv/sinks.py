"""KV event sinks by type name, from the entry-point group ``orchestrator.kv_event_sinks``
(see pyproject.toml), so ``kv_events: {type: zmq, ...}`` selects a sink without the core
importing the plug-in, and an out-of-tree package can add its own."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ValidationError

from orchestrator.core.config import ConfigError, EngineConfig, format_errors
from orchestrator.core.kv.events import KVEventSink

KV_EVENT_SINK_GROUP = "orchestrator.kv_event_sinks"


class KVEventSinkFactory(Protocol):
    """What an entry point of ``orchestrator.kv_event_sinks`` names: a class with a
    pydantic ``Config`` for the options of ``kv_events`` and ``from_config``. ``Config``
    must import without the sink's dependencies; ``from_config`` may import them, opens
    the sink's resources (sockets, threads) and reads the engine config for defaults
    (e.g. the model's name)."""

    Config: ClassVar[type[BaseModel]]

    @classmethod
    def from_config(cls, config: Any, engine: EngineConfig) -> KVEventSink: ...


def registered_kv_event_sinks() -> dict[str, EntryPoint]:
    """Entry points by sink type name (not yet loaded)."""
    return {ep.name: ep for ep in entry_points(group=KV_EVENT_SINK_GROUP)}


def kv_event_sink_class(type_name: str) -> KVEventSinkFactory:
    """Load the factory registered as ``type_name``; ``ConfigError`` names the registered
    ones when there is none."""
    eps = registered_kv_event_sinks()
    if type_name not in eps:
        known = ", ".join(sorted(eps)) or "none (is the project installed?)"
        raise ConfigError(f"kv_events: unknown sink type {type_name!r}; registered: {known}")
    factory: KVEventSinkFactory = eps[type_name].load()
    return factory


def create_kv_event_sink(engine: EngineConfig) -> KVEventSink | None:
    """The sink ``engine.kv_events`` describes, open; ``None`` when the section is absent.
    Raises ``ConfigError`` naming ``kv_events.<key>`` for invalid options. The caller owns
    the sink (``EngineCore.attach_kv_event_sink`` hands it to the engine)."""
    spec = engine.kv_events
    if spec is None:
        return None
    factory = kv_event_sink_class(spec.type)
    try:
        options = factory.Config.model_validate(spec.options)
    except ValidationError as err:
        raise ConfigError(f"kv_events ({spec.type}): {format_errors(err)}") from None
    return factory.from_config(options, engine)
