"""What both TensorRT-LLM executors share: the ``Executor`` protocol over a mode's
``Backend`` (``plugins.trtllm.runner``), the start-up (TensorRT-LLM started, a one-token
warm-up request, the KV cache measured from the iteration statistics and checked), the
free-block refresh while serving, ``info()`` and ``from_config``.

A mode supplies the hooks: ``_start`` (start TensorRT-LLM, return its ``Backend``),
``_first_kv`` (wait, bounded, for the first KV picture after the warm-up), ``_newer_kv``
(the newest picture since the last one, never waiting), ``_stop`` (shut TensorRT-LLM
down), and, as class methods, ``resolve`` (options and engine config to settings) and
``open`` (settings to a running executor).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

from orchestrator.core import (
    ConstraintKind,
    EngineConfig,
    ExecutorInfo,
    SamplingParams,
    SchedulerOutput,
    StepResult,
)
from plugins.trtllm.blocks import BlockTokens
from plugins.trtllm.errors import TrtllmError, TrtllmStalledError
from plugins.trtllm.kv import KvSnapshot
from plugins.trtllm.runner import Ask, Backend, PlanRunner

logger = logging.getLogger(__name__)

_WARMUP = SamplingParams(max_tokens=1, temperature=0)


def import_trtllm(module: str, executor_type: str, needs: str) -> Any:
    """The real TensorRT-LLM ``module``; an ``ImportError`` saying what the
    ``executor_type`` executor needs (``needs``: the releases) when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"the {executor_type} executor needs TensorRT-LLM {needs} ({module} could not be "
            f"imported: {err}); run it inside the NGC TensorRT-LLM container"
        ) from err


class ModeSettings(Protocol):
    """What the shared part reads of a mode's resolved settings (tokens; ``None``
    ``max_seq_len`` leaves the context limit to TensorRT-LLM)."""

    @property
    def tokens_per_block(self) -> int: ...

    @property
    def max_seq_len(self) -> int | None: ...

    @property
    def world_size(self) -> int: ...


OptionsT = TypeVar("OptionsT", bound=BaseModel)
SettingsT = TypeVar("SettingsT", bound=ModeSettings)
Self = TypeVar("Self", bound="TrtllmExecutorBase[Any, Any]")


class TrtllmExecutorBase(ABC, Generic[OptionsT, SettingsT]):
    """The ``Executor`` protocol over a TensorRT-LLM mode.

    ``info()`` reports TensorRT-LLM's KV cache in blocks of ``tokens_per_block`` tokens
    as its iteration statistics give it after a one-token warm-up request at start, and
    ``max_seq_len`` (tokens; ``None`` when left to the model) as the context limit.
    While serving, the statistics are read again at most every ``stats_interval_s``
    seconds, at the end of a step; a step that got a newer picture returns
    TensorRT-LLM's free-block count in ``StepResult.kv_free_blocks``, and
    ``kv_cache_stats()`` is the latest picture. Not thread-safe: one thread calls
    ``execute``.
    """

    Config: ClassVar[type[BaseModel]]

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_config(
        cls: type[Self], config: Any, engine: EngineConfig, *, module: Any = None
    ) -> Self:
        """Start the executor ``config`` describes, after checking that ``engine``'s
        scheduler and cache settings fit it. ``module`` replaces the real TensorRT-LLM
        module of the mode (tests pass a fake)."""
        options = (
            config if isinstance(config, cls.Config) else cls.Config.model_validate(config or {})
        )
        return cls.open(options, cls.resolve(options, engine), module=module)

    @classmethod
    @abstractmethod
    def resolve(cls, options: Any, engine: EngineConfig) -> Any:
        """The mode's settings for ``options``, checked against ``engine``; raises
        ``ConfigError`` naming what does not fit."""

    @classmethod
    @abstractmethod
    def open(cls: type[Self], options: Any, settings: Any, *, module: Any = None) -> Self:
        """Start an executor from resolved settings, with no engine config to check."""

    def __init__(self, settings: SettingsT, options: OptionsT) -> None:
        """Start TensorRT-LLM for ``settings`` and measure its KV cache. ``options`` (the
        mode's ``Config``) gives the adapter settings both modes have: ``seed``,
        ``step_timeout_s``, ``startup_timeout_s`` and ``stats_interval_s``."""
        adapter: Any = options
        self.settings = settings
        self._stats_interval_s = adapter.stats_interval_s
        self._next_stats_s = 0.0
        self._closed = False
        try:
            self._backend = self._start()
            self._kv = self._checked(self._measure_kv(adapter.startup_timeout_s))
        except BaseException:
            self.shutdown()
            raise
        logger.info(
            "TensorRT-LLM KV cache: %d blocks of %d tokens%s",
            self._kv.max_blocks,
            self._kv.tokens_per_block,
            self._start_note(),
        )
        blocks = BlockTokens(self._kv.max_blocks, settings.tokens_per_block)
        self._runner = PlanRunner(
            self._backend,
            blocks,
            max_seq_len=settings.max_seq_len,
            seed=adapter.seed,
            step_timeout_s=adapter.step_timeout_s,
        )

    # ------------------------------------------------------------------ mode hooks

    @abstractmethod
    def _start(self) -> Backend:
        """Start TensorRT-LLM; the backend plans run on."""

    @abstractmethod
    def _first_kv(self, timeout_s: float) -> KvSnapshot | None:
        """The first KV picture after the warm-up request, waiting up to ``timeout_s``
        seconds; ``None`` when none came."""

    @abstractmethod
    def _newer_kv(self) -> KvSnapshot | None:
        """The newest KV picture since the last one taken, without waiting."""

    @abstractmethod
    def _stop(self) -> None:
        """Shut TensorRT-LLM down; called once, also after a failed start."""

    def _start_note(self) -> str:
        """More for the start-up log line (``"; ..."``)."""
        return ""

    def _no_stats_hint(self) -> str:
        """Why a mode may report no KV statistics, for the start-up error."""
        return ""

    # ------------------------------------------------------------------ protocol

    def info(self) -> ExecutorInfo:
        return ExecutorInfo(
            num_kv_blocks=self._kv.max_blocks,
            block_size=self.settings.tokens_per_block,
            max_model_len=self.settings.max_seq_len,
            owns_batching=True,
            top_logprobs=False,  # the chosen token's log-probability only
            seeded_survives_preemption=False,  # TensorRT-LLM seeds a request once, at submission
            constraint_kinds=self._constraint_kinds(),
            num_gpus=self.settings.world_size,
        )

    def _constraint_kinds(self) -> frozenset[ConstraintKind]:
        """The constraint kinds this mode passes on to a TensorRT-LLM that enforces them
        (a mode with any also implements ``compile_constraint``); none by default."""
        return frozenset()

    def execute(self, plan: SchedulerOutput) -> StepResult:
        if self._closed:
            raise TrtllmError("the TensorRT-LLM executor is shut down")
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
        if self._closed:
            return
        self._closed = True
        self._stop()

    # ------------------------------------------------------------------ KV statistics

    def _measure_kv(self, timeout_s: float) -> KvSnapshot:
        """Run a one-token request, then read the KV cache from the iteration statistics
        (TensorRT-LLM reports none before a request has run)."""
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
        wait_s = max(0.0, deadline - time.monotonic())
        snapshot = self._first_kv(wait_s)
        if snapshot is None:
            raise TrtllmError(
                "TensorRT-LLM reported no KV cache statistics after the warm-up request"
                + self._no_stats_hint()
            )
        return snapshot

    def _checked(self, snapshot: KvSnapshot) -> KvSnapshot:
        expected = self.settings.tokens_per_block
        if snapshot.tokens_per_block != expected:
            raise TrtllmError(
                f"TensorRT-LLM's KV blocks hold {snapshot.tokens_per_block} tokens but it "
                f"was started with tokens_per_block={expected}"
            )
        if snapshot.max_blocks < 1:
            raise TrtllmError("TensorRT-LLM reports a KV cache of no blocks")
        return snapshot

    def _refresh_kv(self) -> KvSnapshot | None:
        """If ``stats_interval_s`` has passed, the newest picture since the last one, or
        ``None`` when there is none newer; never waits."""
        now = time.monotonic()
        if now < self._next_stats_s:
            return None
        self._next_stats_s = now + self._stats_interval_s
        snapshot = self._newer_kv()
        if snapshot is None:
            return None
        if snapshot.max_blocks != self._kv.max_blocks:
            logger.warning(
                "TensorRT-LLM now reports %d KV blocks (%d at start); the scheduler keeps %d",
                snapshot.max_blocks,
                self._kv.max_blocks,
                self._kv.max_blocks,
            )
            snapshot = dataclasses.replace(snapshot, max_blocks=self._kv.max_blocks)
        self._kv = snapshot
        return snapshot
