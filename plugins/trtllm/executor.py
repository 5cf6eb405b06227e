"""TensorRT-LLM engine mode: our scheduler's plans run on TensorRT-LLM 1.2.x's C++
``Executor`` (``tensorrt_llm.bindings.executor``) over an engine built by build-engines.

How plans map onto TensorRT-LLM is ``plugins.trtllm.runner``'s and the start-up, KV
measurement and refresh are ``plugins.trtllm.base``'s; this module starts the C++
executor, turns its responses into stream updates and reads its iteration statistics.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.core import ConfigError, EngineConfig
from plugins.trtllm import translate
from plugins.trtllm.base import TrtllmExecutorBase, import_trtllm
from plugins.trtllm.config import TrtllmExecutorConfig
from plugins.trtllm.kv import KvSnapshot
from plugins.trtllm.names import MODULE
from plugins.trtllm.runner import Ask, Backend
from plugins.trtllm.settings import EngineSettings, check_engine_config, load_settings
from plugins.trtllm.streams import Update

_STATS_POLL_S = 0.01  # iteration stats land just after the iteration's responses


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

    def __init__(self, executor_bindings: Any, executor: Any, pad_id: int | None) -> None:
        self._executor_bindings = executor_bindings
        self._executor = executor
        self._pad_id = pad_id

    def submit(self, ask: Ask) -> int:
        # ask.priority: the C++ executor's queue is left first-come-first-served; its
        # request priority is not among the listed (name-checked) keywords.
        request = translate.request(
            self._executor_bindings,
            ask.tokens,
            ask.max_tokens,
            ask.sampling,
            seed=ask.seed,
            pad_id=self._pad_id,
        )
        return int(self._executor.enqueue_request(request))

    def cancel(self, submission: int) -> None:
        self._executor.cancel_request(submission)

    def poll(self, timeout_s: float) -> list[Update]:
        responses = self._executor.await_responses(timeout=timedelta(seconds=timeout_s))
        return [update_from(r) for r in responses]


class TrtllmExecutor(TrtllmExecutorBase[TrtllmExecutorConfig, EngineSettings]):
    """The ``Executor`` protocol over TensorRT-LLM's C++ executor (engine mode): see
    ``TrtllmExecutorBase``. The KV statistics are the executor's
    ``get_latest_iteration_stats()`` (``IterationStats.kv_cache_stats``)."""

    Config: ClassVar[type[TrtllmExecutorConfig]] = TrtllmExecutorConfig

    def __init__(
        self,
        executor_bindings: Any,
        settings: EngineSettings,
        options: TrtllmExecutorConfig,
        worker_path: Path | None = None,
    ) -> None:
        self._executor_bindings = executor_bindings
        self._worker_path = worker_path
        self._executor: Any = None
        super().__init__(settings, options)

    @classmethod
    def resolve(cls, options: TrtllmExecutorConfig, engine: EngineConfig) -> EngineSettings:
        settings = load_settings(options)
        check_engine_config(settings, engine)
        return settings

    @classmethod
    def open(
        cls, options: TrtllmExecutorConfig, settings: EngineSettings, *, module: Any = None
    ) -> TrtllmExecutor:
        executor_bindings = (
            module if module is not None else import_trtllm(MODULE, "trtllm", "1.2.x")
        )
        worker_path = options.executor_worker_path
        if worker_path is None and settings.world_size > 1:
            worker_path = default_worker_path()
        return cls(executor_bindings, settings, options, worker_path)

    # ------------------------------------------------------------------ mode hooks

    def _start(self) -> Backend:
        settings = self.settings
        self._executor = self._executor_bindings.Executor(
            model_path=settings.engine_path,
            model_type=self._executor_bindings.ModelType.DECODER_ONLY,
            executor_config=translate.executor_config(
                self._executor_bindings, settings, self._worker_path
            ),
        )
        return EngineBackend(self._executor_bindings, self._executor, settings.pad_id)

    def _first_kv(self, timeout_s: float) -> KvSnapshot | None:
        deadline = time.monotonic() + timeout_s
        while True:
            snapshot = self._newer_kv()
            if snapshot is not None or time.monotonic() >= deadline:
                return snapshot
            time.sleep(_STATS_POLL_S)

    def _newer_kv(self) -> KvSnapshot | None:
        # The executor hands each iteration's statistics out once: what it returns is new.
        stats = [
            s.kv_cache_stats
            for s in self._executor.get_latest_iteration_stats()
            if s.kv_cache_stats is not None
        ]
        if not stats:
            return None
        kv = stats[-1]
        return KvSnapshot(
            int(kv.max_num_blocks),
            int(kv.free_num_blocks),
            int(kv.used_num_blocks),
            int(kv.tokens_per_block),
            time.monotonic(),
        )

    def _stop(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()

    def _no_stats_hint(self) -> str:
        return f" (is the engine at {self.settings.engine_path} built with a paged KV cache?)"
