"""TensorRT-LLM LLM-API mode: our scheduler's plans run on ``tensorrt_llm.LLM`` (the
PyTorch backend that ``trtllm-serve`` uses; TensorRT-LLM 1.2.1 and newer).

How plans map onto TensorRT-LLM is ``plugins.trtllm.runner``'s, the same as in engine
mode; this module loads the model, measures its KV cache and keeps the latest KV
picture TensorRT-LLM reports.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
import weakref
from typing import Any, ClassVar

from orchestrator.core import (
    EngineConfig,
    ExecutorInfo,
    SamplingParams,
    SchedulerOutput,
    StepResult,
)
from plugins.trtllm.errors import TrtllmError, TrtllmStalledError
from plugins.trtllm.llm_api import translate
from plugins.trtllm.llm_api.backend import EventLoopThread, LlmApiBackend
from plugins.trtllm.llm_api.config import TrtllmLlmApiConfig
from plugins.trtllm.llm_api.settings import (
    LlmApiSettings,
    check_engine_config,
    load_settings,
    with_model_len,
)
from plugins.trtllm.llm_api.stats import KvStatsReader
from plugins.trtllm.llm_api.translate import KvSnapshot, ReleaseOptions
from plugins.trtllm.names import KV_CACHE_STATS_KEY, LLM_API_MODULE
from plugins.trtllm.runner import Ask, PlanRunner

logger = logging.getLogger(__name__)

_WARMUP = SamplingParams(max_tokens=1, temperature=0)
# The longest wait for the warm-up's statistics after its last token: they arrive about
# 0.2-0.4 s after the iteration (llm_api/stats.py), so this is a generous bound.
_STATS_ARRIVAL_S = 30.0


def import_llmapi() -> Any:
    """The real ``tensorrt_llm.llmapi`` module."""
    try:
        return importlib.import_module(LLM_API_MODULE)
    except ImportError as err:
        raise ImportError(
            f"the trtllm-llmapi executor needs TensorRT-LLM 1.2.1 or newer ({LLM_API_MODULE} "
            f"could not be imported: {err}); run it inside the NGC TensorRT-LLM container"
        ) from err


def _release(loop: EventLoopThread, owned: list[Any]) -> None:
    """Shut the LLM down, then stop the event loop (cancelling the stream tasks). In this
    order no result of a request still in flight is handed to a closed loop: the LLM's
    worker threads deliver to the loop until its shutdown returns."""
    for llm in owned:
        llm.shutdown()
    loop.stop()


class TrtllmLlmApiExecutor:
    """The ``Executor`` protocol over ``tensorrt_llm.LLM`` (LLM-API mode).

    ``info()`` reports TensorRT-LLM's KV cache in blocks of ``tokens_per_block`` tokens
    as its iteration statistics give it (``kvCacheStats.maxNumBlocks``) after a
    one-token warm-up request at start, and ``max_seq_len`` (tokens; ``None`` when left
    to the model) as the context limit. During serving the statistics are read again at
    most every ``stats_interval_s`` seconds, at a step, from what the loop-side reader
    (``llm_api.stats``) last received; ``kv_cache_stats()`` is the latest picture. Not
    thread-safe: one thread calls ``execute``.
    """

    Config: ClassVar[type[TrtllmLlmApiConfig]] = TrtllmLlmApiConfig

    def __init__(
        self,
        llmapi: Any,
        settings: LlmApiSettings,
        *,
        seed: int | None = None,
        step_timeout_s: float = 600.0,
        startup_timeout_s: float = 1800.0,
        stats_interval_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self._stats_interval_s = stats_interval_s
        self._next_stats_s = 0.0
        self._stats_version = 0
        self._closed = False
        self._loop = EventLoopThread()
        owned: list[Any] = []
        # Also run when the executor is dropped without shutdown: the loop's thread and the
        # LLM's workers would otherwise outlive it.
        self._release = weakref.finalize(self, _release, self._loop, owned)
        try:
            release = translate.release_options(llmapi)
            self._llm = translate.start_llm(llmapi, settings, release)
            owned.append(self._llm)
            self._stats = KvStatsReader(self._llm)
            self._backend = LlmApiBackend(llmapi, self._llm, self._loop, self._stats, release)
            self._kv = self._measure_kv(startup_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        logger.info(
            "TensorRT-LLM KV cache: %d blocks of %d tokens; %s",
            self._kv.max_blocks,
            self._kv.tokens_per_block,
            policy_summary(settings, release),
        )
        self._runner = PlanRunner(
            self._backend,
            num_blocks=self._kv.max_blocks,
            block_size=settings.tokens_per_block,
            max_seq_len=settings.max_seq_len,
            seed=seed,
            step_timeout_s=step_timeout_s,
        )

    @classmethod
    def from_config(
        cls, config: Any, engine: EngineConfig, *, llmapi: Any = None
    ) -> TrtllmLlmApiExecutor:
        """Start the model ``config`` names, after checking that ``engine``'s scheduler and
        cache settings fit it. ``llmapi`` replaces the real ``tensorrt_llm.llmapi`` module
        (tests pass a fake)."""
        options = (
            config
            if isinstance(config, TrtllmLlmApiConfig)
            else TrtllmLlmApiConfig.model_validate(config or {})
        )
        settings = with_model_len(load_settings(options), engine)
        check_engine_config(settings, engine)
        return cls.open(options, settings, llmapi=llmapi)

    @classmethod
    def open(
        cls, options: TrtllmLlmApiConfig, settings: LlmApiSettings, *, llmapi: Any = None
    ) -> TrtllmLlmApiExecutor:
        """Start an executor from resolved settings, with no engine config to check."""
        return cls(
            llmapi if llmapi is not None else import_llmapi(),
            settings,
            seed=options.seed,
            step_timeout_s=options.step_timeout_s,
            startup_timeout_s=options.startup_timeout_s,
            stats_interval_s=options.stats_interval_s,
        )

    # ------------------------------------------------------------------ protocol

    def info(self) -> ExecutorInfo:
        return ExecutorInfo(
            num_kv_blocks=self._kv.max_blocks,
            block_size=self.settings.tokens_per_block,
            max_model_len=self.settings.max_seq_len,
            owns_batching=True,
            top_logprobs=False,  # the chosen token's log-probability only
            seeded_survives_preemption=False,  # a resubmitted request restarts its seed
            num_gpus=self.settings.world_size,
        )

    def execute(self, plan: SchedulerOutput) -> StepResult:
        if self._closed:
            raise TrtllmError("the TensorRT-LLM LLM is shut down")
        result = self._runner.execute(plan)
        fresh = self._refresh_kv()
        if fresh is None:
            return result
        # A fresh count lets the scheduler admit against TensorRT-LLM's own free blocks.
        return dataclasses.replace(result, kv_free_blocks=fresh.free_blocks)

    def kv_cache_stats(self) -> KvSnapshot:
        """TensorRT-LLM's KV cache as last reported: at start, then at most every
        ``stats_interval_s`` at a step. Its ``max_blocks`` is the capacity ``info()``
        reports; its free and used blocks are TensorRT-LLM's own count, which runs ahead
        of the scheduler's (it allocates for tokens it generates before we ask)."""
        return self._kv

    def shutdown(self) -> None:
        self._closed = True
        self._release()  # runs once

    # ------------------------------------------------------------------ KV statistics

    def _measure_kv(self, timeout_s: float) -> KvSnapshot:
        """Run a one-token request, then wait (bounded) for the KV cache in the iteration
        statistics the loop-side reader receives (TensorRT-LLM reports none before a
        request has run, and queues them a few tenths of a second after it)."""
        deadline = time.monotonic() + timeout_s
        submission = self._backend.submit(Ask([0], 1, _WARMUP, None))
        finished = False
        while not finished:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TrtllmStalledError(f"the warm-up request got no answer in {timeout_s} s")
            for update in self._backend.poll(remaining):
                if update.submission != submission:
                    continue
                if update.error is not None:
                    raise TrtllmError(f"the warm-up request failed: {update.error}")
                finished = update.final
        wait_s = max(0.0, min(_STATS_ARRIVAL_S, deadline - time.monotonic()))
        snapshot = self._stats.latest.wait_first(wait_s)
        if snapshot is None:
            why = self._stats.latest.error or f"none arrived within {wait_s:.1f} s"
            raise TrtllmError(
                "TensorRT-LLM reported no KV cache statistics after the warm-up request: "
                f"LLM.get_stats_async gave no entry with {KV_CACHE_STATS_KEY} ({why}; the "
                "LLM runs with enable_iter_perf_stats=True)"
            )
        self._stats_version = 1
        return self._checked(snapshot)

    def _checked(self, snapshot: KvSnapshot) -> KvSnapshot:
        expected = self.settings.tokens_per_block
        if snapshot.tokens_per_block != expected:
            raise TrtllmError(
                f"TensorRT-LLM's KV blocks for {self.settings.model} hold "
                f"{snapshot.tokens_per_block} tokens but it was started with "
                f"tokens_per_block={expected}"
            )
        if snapshot.max_blocks < 1:
            raise TrtllmError("TensorRT-LLM reports a KV cache of no blocks")
        return snapshot

    def _refresh_kv(self) -> KvSnapshot | None:
        """If ``stats_interval_s`` has passed, the picture the reader received since the
        last one taken, or ``None`` when there is none newer; never waits."""
        now = time.monotonic()
        if now < self._next_stats_s:
            return None
        self._next_stats_s = now + self._stats_interval_s
        newer = self._stats.latest.newer_than(self._stats_version)
        if newer is None:
            return None
        snapshot, self._stats_version = newer
        if snapshot.max_blocks != self._kv.max_blocks:
            logger.warning(
                "TensorRT-LLM now reports %d KV blocks (%d at start); the scheduler keeps %d",
                snapshot.max_blocks,
                self._kv.max_blocks,
                self._kv.max_blocks,
            )
            snapshot = KvSnapshot(
                self._kv.max_blocks,
                snapshot.free_blocks,
                snapshot.used_blocks,
                snapshot.tokens_per_block,
                snapshot.at_s,
            )
        self._kv = snapshot
        return snapshot


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
