"""The fake ``Executor``: TensorRT-LLM 1.2.x's C++ executor over an engine folder, with
in-flight batching by ``tests.trtllm.fake_batching`` (capacity policies included).

What it reproduces, because the adapter relies on it:

- ``enqueue_request`` returns an id at once (1, 2, ...); the request is validated by
  the worker, and an invalid one gets an error response, not an exception.
- Tokens are produced asynchronously, one per request per iteration once its context is
  processed (in chunks within ``max_num_tokens`` when chunked context is on). With
  ``streaming`` each response holds that iteration's new tokens (the input too in the
  first, unless ``exclude_input_from_output``); without it one final response holds
  them all. Log-probabilities, when asked for, come for all tokens so far.
- A request ends with a final response: ``LENGTH`` after ``max_tokens`` tokens,
  ``STOP_WORDS`` when its output ends with a stop word (included in the output),
  ``END_ID`` when it samples ``end_id`` (left out of the output; -1 disables it).
  ``cancel_request`` ends a request with a final ``CANCELLED`` response; ids it does not
  know are ignored.
- The KV cache holds ``kv_memory_tokens x free_gpu_memory_fraction`` tokens (default
  fraction 0.9), capped by ``KvCacheConfig.max_tokens``, in blocks of the engine's
  ``tokens_per_block``, and is shared under the ``SchedulerConfig``'s capacity policy
  (see fake_batching). Every iteration records ``IterationStats`` with the KV stats.

The engine folder's ``config.json`` gives the limits (``build_config``) and the fake's
own knobs (``fake``: ``vocab_size``, ``kv_memory_tokens``, ``iteration_ms``, and
``fail_token_id``: a request whose input holds that token fails with an error response
after its first output token, standing in for a run-time error).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.trtllm.fake_batching import Batcher, Event, Job, KvPicture, Limits
from tests.trtllm.fake_model import Sampler
from tests.trtllm.fake_tensorrt_llm._types import (
    ExecutorConfig,
    FinishReason,
    IterationStats,
    KvCacheStats,
    ModelType,
    Request,
    Response,
    Result,
    model_path_arg,
)

_DEFAULT_FRACTION = 0.9
_STATS_KEPT = 1000


@dataclass(frozen=True)
class EngineLimits:
    """What the fake engine folder's config.json says."""

    max_batch_size: int
    max_num_tokens: int
    max_input_len: int
    max_seq_len: int
    tokens_per_block: int
    vocab_size: int
    kv_memory_tokens: int
    iteration_s: float
    fail_token_id: int | None

    @classmethod
    def read(cls, engine_dir: Path) -> EngineLimits:
        data = json.loads((engine_dir / "config.json").read_text())
        build, fake = data["build_config"], data["fake"]
        return cls(
            max_batch_size=build["max_batch_size"],
            max_num_tokens=build["max_num_tokens"],
            max_input_len=build["max_input_len"],
            max_seq_len=build["max_seq_len"],
            tokens_per_block=build["plugin_config"]["tokens_per_block"],
            vocab_size=fake["vocab_size"],
            kv_memory_tokens=fake["kv_memory_tokens"],
            iteration_s=fake["iteration_ms"] / 1000,
            fail_token_id=fake.get("fail_token_id"),
        )

    def runtime(self, config: ExecutorConfig) -> Limits:
        """The batcher's limits under ``config``: the engine's, narrowed by the config."""
        kv = config.kv_cache_config
        fraction = kv.free_gpu_memory_fraction
        tokens = int(self.kv_memory_tokens * (_DEFAULT_FRACTION if fraction is None else fraction))
        if kv.max_tokens is not None:
            tokens = min(tokens, kv.max_tokens)
        return Limits(
            max_batch_size=min(config.max_batch_size or self.max_batch_size, self.max_batch_size),
            max_num_tokens=min(config.max_num_tokens or self.max_num_tokens, self.max_num_tokens),
            max_input_len=self.max_input_len,
            max_seq_len=self.max_seq_len,
            tokens_per_block=self.tokens_per_block,
            vocab_size=self.vocab_size,
            kv_blocks=tokens // self.tokens_per_block,
            iteration_s=self.iteration_s,
            chunked_context=config.enable_chunked_context,
            policy=config.scheduler_config.capacity_scheduler_policy.name,
            fail_token_id=self.fail_token_id,
        )


def _result(tokens: list[int], logprobs: list[float] | None, reason: FinishReason) -> Result:
    result = Result()
    result.is_final = reason != FinishReason.NOT_FINISHED
    result.output_token_ids = [tokens]
    result.log_probs = [logprobs] if logprobs is not None else None
    result.finish_reasons = [reason]
    return result


class Executor:
    """The subset of ``tensorrt_llm.bindings.executor.Executor`` the adapter uses."""

    def __init__(
        self, model_path: Any, model_type: ModelType, executor_config: ExecutorConfig
    ) -> None:
        path = Path(model_path_arg(model_path))
        if not isinstance(model_type, ModelType):
            raise TypeError(f"Executor(): model_type={model_type!r} is not a ModelType")
        if not isinstance(executor_config, ExecutorConfig):
            raise TypeError(
                f"Executor(): executor_config={executor_config!r} is not an ExecutorConfig"
            )
        if not (path / "config.json").is_file():
            raise RuntimeError(f"[TensorRT-LLM][ERROR] cannot open {path / 'config.json'}")
        self._cond = threading.Condition()
        self._responses: list[Response] = []
        self._stats: deque[IterationStats] = deque(maxlen=_STATS_KEPT)
        self._requests: dict[int, Request] = {}
        self._held: dict[int, list[int]] = {}  # tokens not yet sent, by engine id
        self._stopping = False
        self._shut_down = False
        self._batcher = Batcher(EngineLimits.read(path).runtime(executor_config), self._collect)
        weakref.finalize(self, self._batcher.stop)

    def enqueue_request(self, request: Request) -> int:
        if not isinstance(request, Request):
            raise TypeError(f"enqueue_request(): {request!r} is not a Request")
        self._check_open()
        sampling = request.sampling_config
        job = Job(
            list(request.input_token_ids),
            request.max_tokens,
            Sampler(
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                temperature=sampling.temperature,
                seed=sampling.seed,
            ),
            stop_words=list(request.stop_words or []),
            end_id=request.end_id,
        )
        with self._cond:
            # Registered before the worker can answer for it.
            engine_id = self._batcher.submit(job)
            self._requests[engine_id] = request
            excluded = request.output_config.exclude_input_from_output
            self._held[engine_id] = [] if excluded else list(request.input_token_ids)
        return engine_id

    def await_responses(self, timeout: timedelta | None = None) -> list[Response]:
        """Every response ready, waiting up to ``timeout`` for the first (forever if
        ``None``); an empty list on timeout."""
        if timeout is not None and not isinstance(timeout, timedelta):
            raise TypeError(f"await_responses(): timeout={timeout!r} is not a datetime.timedelta")
        self._check_open()
        with self._cond:
            self._cond.wait_for(
                lambda: bool(self._responses) or self._stopping,
                None if timeout is None else timeout.total_seconds(),
            )
            ready, self._responses = self._responses, []
        return ready

    def cancel_request(self, id: int) -> None:
        self._check_open()
        self._batcher.cancel(id)

    def get_latest_iteration_stats(self) -> list[IterationStats]:
        self._check_open()
        with self._cond:
            stats = list(self._stats)
            self._stats.clear()
        return stats

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._batcher.stop()
        self._shut_down = True

    def _check_open(self) -> None:
        if self._shut_down:
            raise RuntimeError("[TensorRT-LLM][ERROR] the executor has been shut down")

    # ------------------------------------------------------------------ worker side

    def _collect(self, events: list[Event], kv: KvPicture) -> None:
        stats = IterationStats()
        stats.kv_cache_stats = KvCacheStats()
        stats.kv_cache_stats.max_num_blocks = kv.max_blocks
        stats.kv_cache_stats.free_num_blocks = kv.free_blocks
        stats.kv_cache_stats.used_num_blocks = kv.used_blocks
        stats.kv_cache_stats.tokens_per_block = kv.tokens_per_block
        with self._cond:
            for event in events:
                response = self._response(event)
                if response is not None:
                    self._responses.append(response)
            self._stats.append(stats)
            self._cond.notify_all()

    def _response(self, event: Event) -> Response | None:
        """The response ``event`` makes, if any (holds ``_cond``)."""
        request = self._requests.get(event.job_id)
        if request is None:
            return None
        if event.error is not None or event.final:
            del self._requests[event.job_id]
        if event.error is not None:
            del self._held[event.job_id]
            return Response._make(event.job_id, None, event.error)
        held = self._held[event.job_id]
        held.extend(event.tokens)
        if not (request.streaming or event.final):
            return None  # a non-streaming request gets one final response
        tokens, self._held[event.job_id] = list(held), []
        if event.final:
            del self._held[event.job_id]
        logprobs = list(event.logprobs) if request.output_config.return_log_probs else None
        result = _result(tokens, logprobs, FinishReason[event.reason])
        return Response._make(event.job_id, result, None)
