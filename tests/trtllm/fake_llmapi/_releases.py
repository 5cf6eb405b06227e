"""The fake LLM API in the shape of a release without the per-release keywords
(plugins/trtllm/names.py ``optional``): ``KvCacheConfig`` without
``use_kv_cache_manager_v2``, ``SchedulerConfig`` without ``waiting_queue_policy``, and
``LLM.generate_async`` without ``priority`` (``tensorrt_llm/llmapi/llm.py`` at
``4c05a748``). The package itself has the newest shape."""

from __future__ import annotations

import types
from typing import Any

from pydantic import BaseModel, create_model

from tests.trtllm.fake_llmapi import _llm, _options


def _without(cls: type[BaseModel], field: str) -> type[BaseModel]:
    """A strict pydantic model like ``cls`` minus one field."""
    fields: dict[str, Any] = {
        name: (info.annotation, info) for name, info in cls.model_fields.items() if name != field
    }
    return create_model(cls.__name__, __base__=_options._Strict, **fields)


KvCacheConfig = _without(_options.KvCacheConfig, "use_kv_cache_manager_v2")
SchedulerConfig = _without(_options.SchedulerConfig, "waiting_queue_policy")


class LLM(_llm.LLM):
    """Takes the older option classes (as values of the same fields) and no priority."""

    def __init__(self, model: Any, **options: Any) -> None:
        for key, newest in (
            ("kv_cache_config", _options.KvCacheConfig),
            ("scheduler_config", _options.SchedulerConfig),
        ):
            if isinstance(options.get(key), BaseModel):
                options[key] = newest(**options[key].model_dump())
        super().__init__(model, **options)

    def generate_async(  # type: ignore[override]
        self, inputs: list[int], sampling_params: Any = None, *, streaming: bool = False
    ) -> _llm.RequestOutput:
        return super().generate_async(inputs, sampling_params, streaming=streaming)


def release_1_2(base: types.ModuleType | types.SimpleNamespace) -> types.SimpleNamespace:
    """``base`` (the fake module, or a spy copy of it) with the older classes."""
    names = {n: getattr(base, n) for n in dir(base) if not n.startswith("_")}
    names |= {"KvCacheConfig": KvCacheConfig, "SchedulerConfig": SchedulerConfig}
    if names.get("LLM") is _llm.LLM:
        names["LLM"] = LLM
    return types.SimpleNamespace(**names)
