"""The fake ``LLM`` and its request outputs: TensorRT-LLM's LLM API on the PyTorch
backend, over the fake model with in-flight batching by ``tests.trtllm.fake_batching``.

What it reproduces, because the adapter relies on it:

- ``LLM(model, **options)`` takes ``model`` by position and the rest by keyword,
  validated as TorchLlmArgs are (unknown keys and wrong types refused; ``None`` for
  ``max_batch_size``, ``max_input_len`` and ``max_num_tokens`` means their defaults,
  2048, 1024 and 8192). ``model`` must be a local folder whose ``config.json`` holds
  ``fake``: ``vocab_size``, ``eos_token_id``, ``max_position_embeddings``,
  ``kv_memory_tokens``, ``iteration_ms`` and optionally ``fail_token_id`` and ``gpus``
  (1 by default: more GPUs than that are refused, as TensorRT-LLM refuses more than the
  machine has).
- ``generate_async(inputs, sampling_params, streaming=..., priority=0.5)`` takes token
  ids (``priority`` a float in [0, 1], refused outside it; with
  ``SchedulerConfig(waiting_queue_policy=PRIORITY)`` a higher one leaves the waiting queue
  first), returns a ``RequestOutput`` at once, and raises ``ValueError`` at once for a prompt over
  ``max_num_tokens`` without chunked prefill (TensorRT-LLM's own check); other invalid
  requests fail while iterating. The output is iterated with ``async for`` on the loop
  that was running when it was made; made outside a running loop it has no async queue
  and ``async for`` fails, as in TensorRT-LLM.
- Each streamed output's first completion has ``token_ids_diff`` (tokens since the last
  output) and, with ``logprobs``, ``logprobs_diff`` (``{token: Logprob}`` entries). A
  stop token ends the request with ``finish_reason == "stop"`` and, unless
  ``include_stop_str_in_output``, is trimmed from the output (so the diff leaves it out).
  The model's ``eos_token_id`` ends a request (left out) unless ``ignore_eos``.
  ``abort()`` ends it with ``"cancelled"``. A run-time failure raises from iteration.
- The KV cache holds ``kv_memory_tokens x free_gpu_memory_fraction`` tokens in blocks of
  ``tokens_per_block``, shared under the scheduler config's capacity policy (which the
  V2 KV cache manager, ``use_kv_cache_manager_v2=True``, replaces with MAX_UTILIZATION).
- Iteration statistics (only with ``enable_iter_perf_stats=True``; dicts with
  ``kvCacheStats``) reach ``get_stats(timeout)`` and ``get_stats_async(timeout)``
  through TensorRT-LLM's own plumbing, reproduced in ``_stats``: one ``IterationResult``
  made by the first ``generate_async`` (bound to the loop running there, if any), the
  ``_done`` latch that only a later ``generate_async`` lifts, the sync face of an async
  queue that returns ``None`` at its deadline (so ``get_stats`` raises ``TypeError``
  from ``json.loads(None)``) and taints the queue, and a delivery delay of
  ``stats_delay_ms`` (config.json ``fake``; 200 ms, the worker's sleep, by default).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tests.trtllm.fake_batching import Batcher, Event, Job, KvPicture, Limits
from tests.trtllm.fake_llmapi._options import (
    CapacitySchedulerPolicy,
    CudaGraphConfig,
    GuidedDecodingParams,
    KvCacheConfig,
    SamplingParams,
    SchedulerConfig,
    WaitingQueuePolicy,
)
from tests.trtllm.fake_llmapi._stats import (
    IterationResult,
    StatsDispatcher,
    empty_async_iterable,
)
from tests.trtllm.fake_model import Sampler

logger = logging.getLogger("tensorrt_llm")
_FINISH_REASONS = {"STOP_WORDS": "stop", "END_ID": "stop", "LENGTH": "length"}
_DEFAULT: Any = object()  # a default_factory field's default: a fresh object per call


class RequestError(RuntimeError):
    """What TensorRT-LLM raises from the iteration of a request it failed."""


@dataclass(frozen=True, slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


class _TorchLlmArgs(BaseModel):
    """The listed TorchLlmArgs fields, with their types and defaults."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str | Path
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_cache_config: KvCacheConfig
    enable_chunked_prefill: bool = False
    scheduler_config: SchedulerConfig
    max_batch_size: int | None = 2048
    max_input_len: int | None = 1024
    max_seq_len: int | None = None
    max_num_tokens: int | None = 8192
    cuda_graph_config: CudaGraphConfig | None
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = None
    enable_iter_perf_stats: bool = False


def _effective_policy(args: _TorchLlmArgs) -> str:
    """The capacity policy that runs. With the V2 KV cache manager the PyTorch backend
    schedules with KVCacheV2Scheduler, which replaces any policy but MAX_UTILIZATION with
    a warning (_torch/pyexecutor/scheduler/scheduler_v2.py at 9ba713c3)."""
    asked = args.scheduler_config.capacity_scheduler_policy
    if args.kv_cache_config.use_kv_cache_manager_v2 is True:
        if asked != CapacitySchedulerPolicy.MAX_UTILIZATION:
            logger.warning(
                "KVCacheV2Scheduler only supports MAX_UTILIZATION for now, got %s, "
                "setting to MAX_UTILIZATION",
                asked.value,
            )
        return CapacitySchedulerPolicy.MAX_UTILIZATION.value
    return asked.value


class CompletionOutput:
    """The first (and, at ``n=1``, only) sequence of a request output."""

    def __init__(self) -> None:
        self._token_ids: list[int] = []
        self._logprobs: list[dict[int, Logprob]] = []
        self._last_token_ids_len = 0
        self._last_logprobs_len = 0
        self._finish_reason: str | None = None

    @property
    def token_ids_diff(self) -> list[int]:
        return self._token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> list[dict[int, Logprob]]:
        return self._logprobs[self._last_logprobs_len :]

    @property
    def finish_reason(self) -> str | None:
        return self._finish_reason


class RequestOutput:
    """A request's handle and, after each ``async for`` step, its latest output."""

    def __init__(self) -> None:
        raise RuntimeError("RequestOutput objects come from LLM.generate_async()")

    @classmethod
    def _make(
        cls,
        job_id: int,
        params: SamplingParams,
        batcher: Batcher,
        loop: asyncio.AbstractEventLoop | None,
    ) -> RequestOutput:
        output = object.__new__(cls)
        output._job_id = job_id
        output._params = params
        output._batcher = batcher
        output._loop = loop
        output._aqueue = asyncio.Queue() if loop is not None else None
        output._queue = queue.SimpleQueue() if loop is None else None
        output._completion = CompletionOutput()
        output._done = False
        return output

    _job_id: int
    _params: SamplingParams
    _batcher: Batcher
    _loop: asyncio.AbstractEventLoop | None
    _aqueue: asyncio.Queue[Event] | None
    _queue: queue.SimpleQueue[Event] | None
    _completion: CompletionOutput
    _done: bool

    @property
    def request_id(self) -> int:
        """The request's id (TensorRT-LLM: the client id its executor assigned)."""
        return self._job_id

    @property
    def outputs(self) -> list[CompletionOutput]:
        return [self._completion]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._batcher.cancel(self._job_id)

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        if self._aqueue is None:
            # As in TensorRT-LLM: made outside a running loop, the output has no async queue.
            raise AttributeError("'NoneType' object has no attribute 'get'")
        self._apply(await self._aqueue.get())
        return self

    # ------------------------------------------------------------------ internals

    def _deliver(self, event: Event) -> None:
        """From the worker thread."""
        if self._loop is not None and self._aqueue is not None:
            self._loop.call_soon_threadsafe(self._aqueue.put_nowait, event)
        elif self._queue is not None:
            self._queue.put(event)

    def _wait(self) -> None:
        """Block until the request finishes (an output made outside a loop)."""
        assert self._queue is not None
        while not self._done:
            self._apply(self._queue.get())

    def _apply(self, event: Event) -> None:
        completion, params = self._completion, self._params
        if event.error is not None:
            self._done = True
            raise RequestError(event.error)
        completion._last_token_ids_len = len(completion._token_ids)
        completion._token_ids.extend(event.tokens)
        if params.logprobs:
            completion._last_logprobs_len = len(completion._logprobs)
            new = event.logprobs[len(completion._logprobs) :]
            tail = completion._token_ids[len(completion._logprobs) :]
            completion._logprobs.extend(
                {t: Logprob(lp, 1)} for t, lp in zip(tail, new, strict=False)
            )
        if not event.final:
            return
        self._done = True
        if event.reason == "CANCELLED":
            completion._finish_reason = "cancelled"
            return
        completion._finish_reason = _FINISH_REASONS[event.reason]
        stopped = event.reason == "STOP_WORDS"
        if stopped and not params.include_stop_str_in_output:
            completion._token_ids = completion._token_ids[:-1]  # one-token stop words
            del completion._logprobs[len(completion._token_ids) :]


class LLM:
    """The subset of ``tensorrt_llm.llmapi.LLM`` the adapter uses."""

    def __init__(
        self,
        model: str | Path,
        *,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        kv_cache_config: KvCacheConfig = _DEFAULT,
        enable_chunked_prefill: bool = False,
        scheduler_config: SchedulerConfig = _DEFAULT,
        max_batch_size: int | None = 2048,
        max_input_len: int | None = 1024,
        max_seq_len: int | None = None,
        max_num_tokens: int | None = 8192,
        cuda_graph_config: CudaGraphConfig | None = _DEFAULT,
        guided_decoding_backend: str | None = None,
        enable_iter_perf_stats: bool = False,
    ) -> None:
        args = _TorchLlmArgs(
            model=model,
            tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            kv_cache_config=KvCacheConfig() if kv_cache_config is _DEFAULT else kv_cache_config,
            enable_chunked_prefill=enable_chunked_prefill,
            scheduler_config=(
                SchedulerConfig() if scheduler_config is _DEFAULT else scheduler_config
            ),
            max_batch_size=max_batch_size,
            max_input_len=max_input_len,
            max_seq_len=max_seq_len,
            max_num_tokens=max_num_tokens,
            cuda_graph_config=(
                CudaGraphConfig() if cuda_graph_config is _DEFAULT else cuda_graph_config
            ),
            guided_decoding_backend=guided_decoding_backend,
            enable_iter_perf_stats=enable_iter_perf_stats,
        )
        folder = Path(args.model)
        if not (folder / "config.json").is_file():
            raise OSError(f"{args.model} is not a local model folder (the fake has no Hub)")
        fake = json.loads((folder / "config.json").read_text())["fake"]
        world = args.tensor_parallel_size * args.pipeline_parallel_size
        if world > fake.get("gpus", 1):
            raise RuntimeError(
                f"Only {fake.get('gpus', 1)} GPUs are available, but {world} are required."
            )
        self._args = args
        self._vocab_size = fake["vocab_size"]
        self._eos = fake["eos_token_id"]
        kv = args.kv_cache_config
        fraction = 0.9 if kv.free_gpu_memory_fraction is None else kv.free_gpu_memory_fraction
        self._limits = Limits(
            max_batch_size=args.max_batch_size or 2048,
            max_num_tokens=args.max_num_tokens or 8192,
            max_input_len=args.max_input_len or 1024,
            max_seq_len=args.max_seq_len or fake["max_position_embeddings"],
            tokens_per_block=kv.tokens_per_block,
            vocab_size=fake["vocab_size"],
            kv_blocks=int(fake["kv_memory_tokens"] * fraction) // kv.tokens_per_block,
            iteration_s=fake["iteration_ms"] / 1000,
            chunked_context=args.enable_chunked_prefill,
            policy=_effective_policy(args),
            priority_queue=args.scheduler_config.waiting_queue_policy
            == WaitingQueuePolicy.PRIORITY,
            fail_token_id=fake.get("fail_token_id"),
        )
        self._cond = threading.Condition()
        self._outputs: dict[int, RequestOutput] = {}
        self._iter_stats: IterationResult | None = None
        self._iteration = 0
        self._shut_down = False
        self.guides: list[tuple[list[int], GuidedDecodingParams, str | None]] = []
        self._batcher = Batcher(self._limits, self._collect)
        weak = weakref.ref(self)
        self._stats = StatsDispatcher(
            fake.get("stats_delay_ms", 200) / 1000,
            lambda: None if (llm := weak()) is None else llm._iter_stats,
        )
        weakref.finalize(self, self._batcher.stop)
        weakref.finalize(self, self._stats.stop)

    def generate_async(
        self,
        inputs: list[int],
        sampling_params: SamplingParams | None = None,
        *,
        streaming: bool = False,
        priority: float = 0.5,
    ) -> RequestOutput:
        if self._shut_down:
            raise RuntimeError("LLM is shutting down")
        if not isinstance(inputs, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in inputs
        ):
            raise TypeError(f"the fake takes token ids (a list of int), got {inputs!r}")
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(
                f"The sampling_params must be type SamplingParams or None, but got {type(params)}"
            )
        if not 0.0 <= priority <= 1.0:  # GenerationRequest, tensorrt_llm/executor/request.py
            raise ValueError(f"priority must be a float in [0.0, 1.0], got {priority}")
        guide = params.guided_decoding
        if guide is not None:
            guide._validate()
            # The fake runs no grammar: it records each guide (with the backend it was
            # started with) for the tests to read; its tokens stay the fake model's.
            self.guides.append((list(inputs), guide, self._args.guided_decoding_backend))
        limits = self._limits
        if not limits.chunked_context and len(inputs) > limits.max_num_tokens:
            raise ValueError(
                f"The sum of prompt length ({len(inputs)}), query length (0) should not exceed "
                f"max_num_tokens ({limits.max_num_tokens})"
            )
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        # GenerationExecutor._maybe_initialize_iteration_results, in the caller's thread.
        if self._iter_stats is None:
            self._iter_stats = IterationResult()
        else:
            self._iter_stats.mark_undone()
        job = Job(
            list(inputs),
            params.max_tokens,
            Sampler(
                top_k=params.top_k,
                top_p=params.top_p,
                temperature=params.temperature,
                seed=params.seed,
            ),
            stop_words=[[t] for t in params.stop_token_ids or []],
            end_id=-1 if params.ignore_eos else self._eos,
            priority=priority,
        )
        with self._cond:
            # Registered before the worker can answer for it.
            job_id = self._batcher.submit(job)
            output = RequestOutput._make(job_id, params, self._batcher, loop)
            self._outputs[job_id] = output
        return output

    def generate(
        self, inputs: list[int], sampling_params: SamplingParams | None = None
    ) -> RequestOutput:
        """One prompt, to completion (call it with no event loop running)."""
        output = self.generate_async(inputs, sampling_params)
        output._wait()
        return output

    def get_stats(self, timeout: float | None = 2) -> list[dict[str, Any]]:
        if self._iter_stats is None:
            return []
        self._iter_stats.set_timeout(timeout)
        return self._iter_stats.get_results()

    def get_stats_async(self, timeout: float | None = 2) -> AsyncIterator[dict[str, Any]]:
        if self._iter_stats is None:
            return empty_async_iterable()
        self._iter_stats.set_timeout(timeout)
        return self._iter_stats

    def shutdown(self) -> None:
        self._shut_down = True
        self._batcher.stop()
        self._stats.stop()

    def _collect(self, events: list[Event], kv: KvPicture) -> None:
        with self._cond:
            for event in events:
                output = self._outputs.get(event.job_id)
                if output is None:
                    continue
                if event.final or event.error is not None:
                    del self._outputs[event.job_id]
                output._deliver(event)
            self._iteration += 1
            if self._args.enable_iter_perf_stats:
                self._stats.record(
                    {
                        "iter": self._iteration,
                        "kvCacheStats": {
                            "maxNumBlocks": kv.max_blocks,
                            "freeNumBlocks": kv.free_blocks,
                            "usedNumBlocks": kv.used_blocks,
                            "tokensPerBlock": kv.tokens_per_block,
                        },
                    }
                )
            self._cond.notify_all()
