"""TensorRT-LLM engine mode: our scheduler's plans run on TensorRT-LLM's C++ ``Executor``.

The executor batches in flight, chunks contexts, replays CUDA graphs and owns the KV
cache; our scheduler owns admission, priority order and preemption, over a KV pool the
size of the executor's (measured at start). Per plan:

- ids in ``preempted_ids`` and ``finished_ids`` are cancelled in the executor (unless
  it already finished them) and their buffered tokens dropped;
- each scheduled chunk's tokens are recorded by KV block (``BlockTokens``); prefill chunks
  without ``sample`` need nothing else: the executor takes a prompt whole;
- a request that samples and is not running in the executor (first sampling step, or
  the first after a preemption) is enqueued with all its known tokens, rebuilt from its
  block table, asking for the tokens it may still produce;
- a request that samples gets the next token its stream buffered, waiting on
  ``await_responses`` if none has come yet.

Step durations are wall time. Requests the executor fails (or refuses) are named in
``StepResult.failed`` with its message, after their state is dropped; the engine ends
them with an error and the others carry on.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import random
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from orchestrator.core import (
    ConfigError,
    EngineConfig,
    ExecutorInfo,
    SamplingParams,
    ScheduledRequest,
    SchedulerOutput,
    StepResult,
    TokenLogprobs,
)
from plugins.trtllm import translate
from plugins.trtllm.blocks import BlockTokens
from plugins.trtllm.config import TrtllmExecutorConfig
from plugins.trtllm.errors import TrtllmError, TrtllmStalledError
from plugins.trtllm.names import MODULE
from plugins.trtllm.settings import EngineSettings, check_engine_config, load_settings
from plugins.trtllm.streams import Streams

logger = logging.getLogger(__name__)

_UINT64 = (1 << 64) - 1
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


def resume_seed(seed: int, generated: int) -> int:
    """The seed of a request resumed after ``generated`` tokens: ``seed`` itself for a
    fresh request, else a SplitMix64 mix of both, so a resumed stream draws new random
    numbers instead of replaying those its first tokens used."""
    if generated == 0:
        return seed & _UINT64
    z = (seed + generated * 0x9E3779B97F4A7C15) & _UINT64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _UINT64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _UINT64
    return z ^ (z >> 31)


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
        self._step_timeout_s = step_timeout_s
        self._rng = random.Random(seed)
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
        self._blocks = BlockTokens(self._num_blocks, settings.tokens_per_block)
        self._streams = Streams()
        self._prompt_lens: dict[str, int] = {}  # kept across preemptions, dropped at finish

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
            num_gpus=self.settings.world_size,
        )

    def execute(self, plan: SchedulerOutput) -> StepResult:
        start = time.perf_counter()
        if self._closed:
            raise TrtllmError("the TensorRT-LLM executor is shut down")
        # Route what has arrived first, so that a request the executor has already ended
        # (it runs ahead of our steps) is not cancelled needlessly.
        self._drain(timedelta(0))
        for request_id in plan.preempted_ids:
            self._release(request_id)
        for request_id in plan.finished_ids:
            self._release(request_id)
            self._prompt_lens.pop(request_id, None)
        sampling: list[str] = []
        refused: dict[str, str] = {}
        for scheduled in plan.scheduled:
            request_id = scheduled.request_id
            self._blocks.write(scheduled.block_table, scheduled.start_position, scheduled.token_ids)
            if request_id in self._streams:
                self._check_decode(scheduled)
            elif scheduled.sample:
                error = self._enqueue(scheduled)
                if error is not None:
                    refused[request_id] = error
                    continue
            if scheduled.sample:
                sampling.append(request_id)
        self._wait_until_ready(sampling, start + self._step_timeout_s)
        return self._take(sampling, start, refused)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown()

    # ------------------------------------------------------------------ steps

    def _release(self, request_id: str) -> None:
        stream = self._streams.drop(request_id)
        if stream is not None and not stream.final:
            self._executor.cancel_request(stream.engine_id)

    def _check_decode(self, scheduled: ScheduledRequest) -> None:
        """A request running in the executor only ever decodes the token it was last given:
        anything else means the plan and the executor's state have parted."""
        stream = self._streams.get(scheduled.request_id)
        if scheduled.sample and scheduled.token_ids == [stream.last_token]:
            return
        raise TrtllmError(
            f"request {scheduled.request_id!r} runs in TensorRT-LLM after token "
            f"{stream.last_token}, but the plan gives it {scheduled.token_ids} at position "
            f"{scheduled.start_position} (sample={scheduled.sample})"
        )

    def _enqueue(self, scheduled: ScheduledRequest) -> str | None:
        """Send a request with all its known tokens; returns why it could not be sent."""
        request_id, sampling = scheduled.request_id, scheduled.sampling
        length = scheduled.context_len
        tokens = self._blocks.read(scheduled.block_table, scheduled.start_position)
        tokens += scheduled.token_ids
        # The first enqueue sees the prompt alone; a resumed request's tokens also hold
        # what it generated before its preemption.
        generated = length - self._prompt_lens.setdefault(request_id, length)
        max_tokens = min(sampling.max_tokens - generated, self.settings.max_seq_len - length)
        if max_tokens < 1:
            return (
                f"{length} tokens, {generated} of them generated, leave no room for another "
                f"(max_tokens={sampling.max_tokens}, max_seq_len={self.settings.max_seq_len})"
            )
        try:
            engine_request = translate.request(
                self._tle,
                tokens,
                max_tokens,
                sampling,
                seed=self._seed(sampling, generated),
                pad_id=self.settings.pad_id,
            )
            engine_id = self._executor.enqueue_request(engine_request)
        except Exception as err:  # the bindings' refusal of this one request
            return f"TensorRT-LLM refused the request: {type(err).__name__}: {err}"
        self._streams.add(request_id, engine_id, sampling.logprobs is not None)
        return None

    def _seed(self, sampling: SamplingParams, generated: int) -> int | None:
        if sampling.greedy:
            return None
        if sampling.seed is None:
            # The executor's default seed is 0 for every request: identical prompts would
            # sample identical text.
            return self._rng.getrandbits(64)
        return resume_seed(sampling.seed, generated)

    def _drain(self, timeout: timedelta) -> None:
        for response in self._executor.await_responses(timeout=timeout):
            self._streams.route(response)

    def _wait_until_ready(self, request_ids: list[str], deadline: float) -> None:
        waiting = [rid for rid in request_ids if not self._streams.get(rid).ready]
        while waiting:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TrtllmStalledError(
                    f"TensorRT-LLM produced no token within {self._step_timeout_s} s for "
                    f"request(s) {', '.join(map(repr, waiting))}"
                )
            self._drain(timedelta(seconds=remaining))
            waiting = [rid for rid in waiting if not self._streams.get(rid).ready]

    def _take(self, request_ids: list[str], start: float, refused: dict[str, str]) -> StepResult:
        """One buffered token per request; the requests ``refused`` at enqueue and those
        whose stream ended without a token go into ``failed`` with the executor's message
        (their state is dropped: the executor already finished them)."""
        errors = dict(refused)
        for rid in request_ids:
            stream = self._streams.get(rid)
            if rid not in errors and not stream.pending:
                errors[rid] = stream.error or (
                    f"TensorRT-LLM ended the request ({stream.finish_reason}) before the "
                    "token the scheduler expects"
                )
        for rid in errors:
            self._streams.drop(rid)  # final already: nothing to cancel
        request_ids = [rid for rid in request_ids if rid not in errors]
        sampled: dict[str, int] = {}
        logprobs: dict[str, TokenLogprobs] = {}
        for rid in request_ids:
            stream = self._streams.get(rid)
            token, logprob = stream.take()
            sampled[rid] = token
            if logprob is not None:
                # The executor returns the chosen token's log-probability only.
                logprobs[rid] = TokenLogprobs(logprob, [])
        return StepResult(sampled, time.perf_counter() - start, logprobs, failed=errors)

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
