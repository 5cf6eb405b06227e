"""TensorRT-LLM engine mode: our scheduler's plans run on TensorRT-LLM 1.2.x's C++
``Executor`` (``tensorrt_llm.bindings.executor``) over an engine built by build-engines.

How plans map onto TensorRT-LLM is ``plugins.trtllm.runner``'s; this module starts the
executor, measures its KV cache and turns its responses into stream updates.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.core import (
    ConfigError,
    EngineConfig,
    ExecutorInfo,
    SamplingParams,
    SchedulerOutput,
    StepResult,
)
from plugins.trtllm import translate
from plugins.trtllm.config import TrtllmExecutorConfig
from plugins.trtllm.errors import TrtllmError, TrtllmStalledError
from plugins.trtllm.names import MODULE
from plugins.trtllm.runner import Ask, PlanRunner
from plugins.trtllm.settings import EngineSettings, check_engine_config, load_settings
from plugins.trtllm.streams import Update

logger = logging.getLogger(__name__)

_WARMUP = SamplingParams(max_tokens=1, temperature=0)
_STATS_POLL_S = 0.01  # iteration stats land just after the iteration's responses


def import_bindings() -> Any:
    """The real ``tensorrt_llm.bindings.executor`` module."""
    try:
        return importlib.import_module(MODULE)
    except ImportError as err:
        raise ImportError(
            f"the trtllm executor needs TensorRT-LLM 1.2.x ({MODULE} could not be imported: "
            f"{err}); run it inside the NGC TensorRT-LLM container"
        ) from err


def default_worker_path() -> Path:
    """``executorWorker`` inside the installed TensorRT-LLM package."""
    spec = importlib.util.find_spec("tensorrt_llm")
    if spec is None or spec.origin is None:
        raise ConfigError("executor_worker_path: TensorRT-LLM is not installed; set the path")
    path = Path(spec.origin).parent / "bin" / "executorWorker"
    if not path.is_file():
        raise ConfigError(f"executor_worker_path: {path} does not exist; set the path")
    return path


def update_from(response: Any) -> Update:
    """One executor ``Response`` as a stream update (beam 0: the beam width is 1)."""
    if response.has_error():
        return Update(response.request_id, final=True, error=response.error_msg)
    result = response.result
    tokens = list(result.output_token_ids[0])
    logprobs: list[float | None] = []
    if tokens and result.log_probs is not None:
        # The executor sends the log-probabilities of all tokens so far with each
        # streamed response; the tail is this response's (also right if only the new
        # ones come).
        logprobs = list(result.log_probs[0][-len(tokens) :])
    reason = result.finish_reasons[0].name if result.is_final else None
    return Update(response.request_id, tokens, logprobs, result.is_final, reason)


class EngineBackend:
    """Submissions are the executor's own request ids."""

    def __init__(self, tle: Any, executor: Any, pad_id: int | None) -> None:
        self._tle = tle
        self._executor = executor
        self._pad_id = pad_id

    def submit(self, ask: Ask) -> int:
        # ask.priority: the C++ executor's queue is left first-come-first-served; its
        # request priority is not among the listed (name-checked) keywords.
        request = translate.request(
            self._tle, ask.tokens, ask.max_tokens, ask.sampling, seed=ask.seed, pad_id=self._pad_id
        )
        return int(self._executor.enqueue_request(request))

    def cancel(self, submission: int) -> None:
        self._executor.cancel_request(submission)

    def poll(self, timeout_s: float) -> list[Update]:
        responses = self._executor.await_responses(timeout=timedelta(seconds=timeout_s))
        return [update_from(r) for r in responses]


class TrtllmExecutor:
    """The ``Executor`` protocol over TensorRT-LLM's C++ executor (engine mode).

    ``info()`` reports the executor's KV cache in blocks of the engine's
    ``tokens_per_block``, read from its KV cache statistics after a one-token warm-up
    request at start, and the engine's ``max_seq_len`` (tokens) as the context limit.
    Not thread-safe: one thread calls ``execute``.
    """

    Config: ClassVar[type[TrtllmExecutorConfig]] = TrtllmExecutorConfig

    def __init__(
        self,
        tle: Any,
        settings: EngineSettings,
        *,
        seed: int | None = None,
        step_timeout_s: float = 600.0,
        startup_timeout_s: float = 600.0,
        worker_path: Path | None = None,
    ) -> None:
        self._tle = tle
        self.settings = settings
        self.max_model_len = settings.max_seq_len
        self._executor = tle.Executor(
            model_path=settings.engine_path,
            model_type=tle.ModelType.DECODER_ONLY,
            executor_config=translate.executor_config(tle, settings, worker_path),
        )
        self._closed = False
        try:
            self._num_blocks = self._measure_kv_blocks(startup_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        logger.info(
            "TensorRT-LLM KV cache: %d blocks of %d tokens",
            self._num_blocks,
            settings.tokens_per_block,
        )
        self._runner = PlanRunner(
            EngineBackend(tle, self._executor, settings.pad_id),
            num_blocks=self._num_blocks,
            block_size=settings.tokens_per_block,
            max_seq_len=settings.max_seq_len,
            seed=seed,
            step_timeout_s=step_timeout_s,
        )

    @classmethod
    def from_config(
        cls, config: Any, engine: EngineConfig, *, bindings: Any = None
    ) -> TrtllmExecutor:
        """Start the engine ``config.engine_dir`` holds, after checking that ``engine``'s
        scheduler and cache settings fit it. ``bindings`` replaces the real
        ``tensorrt_llm.bindings.executor`` module (tests pass a fake)."""
        options = (
            config
            if isinstance(config, TrtllmExecutorConfig)
            else TrtllmExecutorConfig.model_validate(config or {})
        )
        settings = load_settings(options)
        check_engine_config(settings, engine)
        return cls.open(options, settings, bindings=bindings)

    @classmethod
    def open(
        cls, options: TrtllmExecutorConfig, settings: EngineSettings, *, bindings: Any = None
    ) -> TrtllmExecutor:
        """Start an executor from resolved settings, with no engine config to check."""
        tle = bindings if bindings is not None else import_bindings()
        worker_path = options.executor_worker_path
        if worker_path is None and settings.world_size > 1:
            worker_path = default_worker_path()
        return cls(
            tle,
            settings,
            seed=options.seed,
            step_timeout_s=options.step_timeout_s,
            startup_timeout_s=options.startup_timeout_s,
            worker_path=worker_path,
        )

    # ------------------------------------------------------------------ protocol

    def info(self) -> ExecutorInfo:
        return ExecutorInfo(
            num_kv_blocks=self._num_blocks,
            block_size=self.settings.tokens_per_block,
            max_model_len=self.max_model_len,
            owns_batching=True,
            top_logprobs=False,  # the executor returns the chosen token's only
            seeded_survives_preemption=False,  # it seeds a request once, at enqueue
            num_gpus=self.settings.world_size,
        )

    def execute(self, plan: SchedulerOutput) -> StepResult:
        if self._closed:
            raise TrtllmError("the TensorRT-LLM executor is shut down")
        return self._runner.execute(plan)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown()

    # ------------------------------------------------------------------ start

    def _measure_kv_blocks(self, timeout_s: float) -> int:
        """Run a one-token request and read the KV cache size from the iteration stats."""
        deadline = time.monotonic() + timeout_s
        probe = translate.request(
            self._tle, [0], 1, _WARMUP, seed=None, pad_id=self.settings.pad_id
        )
        engine_id = self._executor.enqueue_request(probe)
        finished = False
        while not finished:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TrtllmStalledError(f"the warm-up request got no answer in {timeout_s} s")
            for response in self._executor.await_responses(timeout=timedelta(seconds=remaining)):
                if response.request_id != engine_id:
                    continue
                if response.has_error():
                    raise TrtllmError(f"the warm-up request failed: {response.error_msg}")
                finished = response.result.is_final
        while True:
            stats = [
                s.kv_cache_stats
                for s in self._executor.get_latest_iteration_stats()
                if s.kv_cache_stats is not None
            ]
            if stats:
                return self._blocks_from(stats[-1])
            if time.monotonic() >= deadline:
                raise TrtllmError(
                    "TensorRT-LLM reported no KV cache statistics after the warm-up request "
                    "(is the engine built with a paged KV cache?)"
                )
            time.sleep(_STATS_POLL_S)

    def _blocks_from(self, kv_stats: Any) -> int:
        expected = self.settings.tokens_per_block
        if kv_stats.tokens_per_block != expected:
            raise TrtllmError(
                f"the engine at {self.settings.engine_path} uses KV blocks of "
                f"{kv_stats.tokens_per_block} tokens but its manifest says {expected}"
            )
        if kv_stats.max_num_blocks < 1:
            raise TrtllmError("TensorRT-LLM reports a KV cache of no blocks")
        return int(kv_stats.max_num_blocks)
