"""TensorRT-LLM LLM-API mode: our scheduler's plans run on ``tensorrt_llm.LLM`` (the
PyTorch backend that ``trtllm-serve`` uses; TensorRT-LLM 1.2.1 and newer).

How plans map onto TensorRT-LLM is ``plugins.trtllm.runner``'s and the start-up, KV
measurement and refresh are ``plugins.trtllm.base``'s, the same as in engine mode; this
module loads the model on an event loop of its own and reads the KV pictures the
loop-side statistics reader (``llm_api.stats``) receives.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from orchestrator.core import ConstraintKind, ConstraintSpec, EngineConfig
from plugins.trtllm.base import TrtllmExecutorBase, import_trtllm
from plugins.trtllm.kv import KvSnapshot
from plugins.trtllm.llm_api import translate
from plugins.trtllm.llm_api.backend import EventLoopThread, LlmApiBackend
from plugins.trtllm.llm_api.config import TrtllmLlmApiConfig
from plugins.trtllm.llm_api.guided import Guide, constraint_kinds, guide_of
from plugins.trtllm.llm_api.settings import (
    LlmApiSettings,
    check_engine_config,
    load_settings,
    with_model_len,
    with_scheduling,
)
from plugins.trtllm.llm_api.stats import KvStatsReader
from plugins.trtllm.llm_api.translate import ReleaseOptions
from plugins.trtllm.names import KV_CACHE_STATS_KEY, LLM_API_MODULE
from plugins.trtllm.runner import Backend

# The longest wait for the warm-up's statistics after its last token: they arrive about
# 0.2-0.4 s after the iteration (llm_api/stats.py), so this is a generous bound.
_STATS_ARRIVAL_S = 30.0


def _release(loop: EventLoopThread, owned: list[Any]) -> None:
    """Shut the LLM down (then undo the in-executor installation, started before it),
    then stop the event loop (cancelling the stream tasks). In this order no result of a
    request still in flight is handed to a closed loop: the LLM's worker threads deliver
    to the loop until its shutdown returns."""
    for item in reversed(owned):
        item.shutdown()
    loop.stop()


class WithLlmOptions:
    """``llmapi`` whose ``LLM`` is built with ``options`` added: the in-executor mode's
    TorchLlmArgs fields (``names.IN_EXECUTOR_LLM_OPTIONS``), which only that mode passes.
    Every other name is ``llmapi``'s."""

    def __init__(self, llmapi: Any, options: dict[str, Any]) -> None:
        self._llmapi = llmapi
        self._options = options

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llmapi, name)

    def LLM(self, *args: Any, **kwargs: Any) -> Any:
        return self._llmapi.LLM(*args, **kwargs, **self._options)


class TrtllmLlmApiExecutor(TrtllmExecutorBase[TrtllmLlmApiConfig, LlmApiSettings]):
    """The ``Executor`` protocol over ``tensorrt_llm.LLM`` (LLM-API mode): see
    ``TrtllmExecutorBase``. The KV statistics are ``kvCacheStats`` entries of
    ``LLM.get_stats_async``, read on the adapter's loop (``llm_api.stats``).

    Constraints: with ``guided_decoding_backend`` set, the kinds that backend compiles
    (``llm_api.guided``) are passed on as ``GuidedDecodingParams``; TensorRT-LLM compiles
    and applies them. ``compile_constraint`` only checks and translates the spec. A
    constrained request preempted after its first token fails rather than resume (its
    guide would restart at the resumed position)."""

    Config: ClassVar[type[TrtllmLlmApiConfig]] = TrtllmLlmApiConfig
    # Imports TensorRT-LLM's private modules for in-executor scheduling (tests replace it).
    import_module: ClassVar[Callable[[str], Any]] = staticmethod(importlib.import_module)

    def __init__(self, llmapi: Any, settings: LlmApiSettings, options: TrtllmLlmApiConfig) -> None:
        self._llmapi = llmapi
        self._release: ReleaseOptions | None = None
        self._stats_version = 0
        self._loop = EventLoopThread()
        self._owned: list[Any] = []
        # Also run when the executor is dropped without shutdown: the loop's thread and the
        # LLM's workers would otherwise outlive it.
        self._release_all = weakref.finalize(self, _release, self._loop, self._owned)
        super().__init__(settings, options)

    @classmethod
    def resolve(cls, options: TrtllmLlmApiConfig, engine: EngineConfig) -> LlmApiSettings:
        settings = with_scheduling(with_model_len(load_settings(options), engine), options, engine)
        check_engine_config(settings, engine)
        return settings

    @classmethod
    def open(
        cls, options: TrtllmLlmApiConfig, settings: LlmApiSettings, *, module: Any = None
    ) -> TrtllmLlmApiExecutor:
        llmapi = module
        if llmapi is None:
            llmapi = import_trtllm(LLM_API_MODULE, "trtllm-llmapi", "1.2.1 or newer")
        return cls(llmapi, settings, options)

    def compile_constraint(self, spec: ConstraintSpec) -> Guide:
        """The guide for ``spec`` (``ConstraintError`` for a spec the backend cannot
        take); thread-safe: reads only the settings."""
        backend = self.settings.guided_decoding_backend
        if backend is None:
            raise ValueError("no guided_decoding_backend is configured")
        return guide_of(spec, backend)

    # ------------------------------------------------------------------ mode hooks

    def _constraint_kinds(self) -> frozenset[ConstraintKind]:
        return constraint_kinds(self.settings.guided_decoding_backend)

    def _start(self) -> Backend:
        self._release = translate.release_options(self._llmapi)
        llmapi, facts, refusals = self._llmapi, None, None
        core = self.settings.in_executor
        if core is not None:
            # Before the LLM: its worker builds the executor, and with it our scheduler.
            from plugins.trtllm.in_executor import start as in_executor

            imports = type(self).import_module
            mode = in_executor.start(core, self.settings.tokens_per_block, imports)
            self._owned.append(mode)
            llmapi = WithLlmOptions(llmapi, in_executor.LLM_OPTIONS)
            facts, refusals = mode.facts, mode.refusals
        llm = translate.start_llm(llmapi, self.settings, self._release)
        self._owned.append(llm)
        if core is not None:
            mode.check_started()  # our scheduler is the one TensorRT-LLM's loop runs
        self._stats = KvStatsReader(llm)
        return LlmApiBackend(
            self._llmapi, llm, self._loop, self._stats, self._release, facts, refusals
        )

    def _first_kv(self, timeout_s: float) -> KvSnapshot | None:
        snapshot = self._stats.latest.wait_first(min(_STATS_ARRIVAL_S, timeout_s))
        self._stats_version = 1
        return snapshot

    def _newer_kv(self) -> KvSnapshot | None:
        newer = self._stats.latest.newer_than(self._stats_version)
        if newer is None:
            return None
        snapshot, self._stats_version = newer
        return snapshot

    def _stop(self) -> None:
        self._release_all()  # runs once

    def _start_note(self) -> str:
        assert self._release is not None  # set by _start
        if self.settings.in_executor is not None:
            # Ours replaces TensorRT-LLM's capacity and micro-batch schedulers, so the
            # configured capacity policy has no effect: say so rather than ignore it.
            return (
                "; in-executor scheduling: our scheduler decides every iteration "
                f"(capacity policy {self.settings.capacity_scheduler_policy} not used)"
            )
        return "; " + policy_summary(self.settings, self._release)

    def _no_stats_hint(self) -> str:
        why = self._stats.latest.error or "none arrived in time"
        return (
            f": LLM.get_stats_async gave no entry with {KV_CACHE_STATS_KEY} ({why}; the LLM "
            "runs with enable_iter_perf_stats=True)"
        )


def policy_summary(settings: LlmApiSettings, release: ReleaseOptions) -> str:
    """The start-up log's account of the scheduling TensorRT-LLM runs under."""
    policy = f"capacity policy {settings.capacity_scheduler_policy}"
    if release.pins_kv_manager_v1:
        policy += " (KV cache manager V1 pinned: use_kv_cache_manager_v2=False)"
    else:
        policy += " (this release has no use_kv_cache_manager_v2 option)"
    if release.passes_priority:
        return policy + "; waiting queue by request priority"
    return policy + "; waiting queue first-come-first-served (no per-request priority here)"
