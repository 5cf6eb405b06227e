"""The fake ``Executor``: a background thread that runs in-flight batching iterations
over a toy model, as TensorRT-LLM's C++ executor does over an engine.

What it reproduces, because the adapter relies on it:

- ``enqueue_request`` returns an id at once (1, 2, ...); the request is validated by
  the worker, and an invalid one gets an error response, not an exception.
- Tokens are produced asynchronously, one per request per iteration once its context is
  processed (in chunks of at most ``max_num_tokens`` a step when chunked context is on).
  With ``streaming`` each response holds that iteration's new tokens; log-probabilities,
  when asked for, come for all tokens so far.
- A request ends with a final response: ``LENGTH`` after ``max_tokens`` tokens,
  ``STOP_WORDS`` when its output ends with a stop word (included in the output),
  ``END_ID`` when it samples ``end_id`` (left out of the output; -1 disables it).
  ``cancel_request`` ends a running request with a final ``CANCELLED`` response; ids it
  does not know are ignored.
- The KV cache holds ``kv_memory_tokens x free_gpu_memory_fraction`` tokens (default
  fraction 0.9), capped by ``KvCacheConfig.max_tokens``, in blocks of the engine's
  ``tokens_per_block``. Admission reserves a request's input plus ``max_tokens`` (the
  ``GUARANTEED_NO_EVICT`` rule; the fake applies it under every policy); what does not
  fit waits in the queue. Every iteration records ``IterationStats`` with the KV stats.

The engine folder's ``config.json`` gives the limits (``build_config``) and the fake's
own knobs (``fake``: ``vocab_size``, ``kv_memory_tokens``, ``iteration_ms``, and
``fail_token_id``: a request whose input holds that token fails with an error response
after its first output token, standing in for a run-time error).
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.trtllm.fake_tensorrt_llm._model import Sampler, next_token_logits
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


@dataclass
class _Running:
    engine_id: int
    request: Request
    sampler: Sampler
    context: list[int]
    blocks: int
    computed: int = 0
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sent_input: bool = False


class _Engine:
    """State shared by the ``Executor`` front and its worker thread."""

    def __init__(self, limits: EngineLimits, config: ExecutorConfig) -> None:
        self.limits = limits
        self.config = config
        kv = config.kv_cache_config
        fraction = kv.free_gpu_memory_fraction
        tokens = int(
            limits.kv_memory_tokens * (_DEFAULT_FRACTION if fraction is None else fraction)
        )
        if kv.max_tokens is not None:
            tokens = min(tokens, kv.max_tokens)
        self.total_blocks = tokens // limits.tokens_per_block
        self.max_batch_size = min(
            config.max_batch_size or limits.max_batch_size, limits.max_batch_size
        )
        self.max_num_tokens = min(
            config.max_num_tokens or limits.max_num_tokens, limits.max_num_tokens
        )
        self.cond = threading.Condition()
        self.queue: deque[tuple[int, Request]] = deque()
        self.cancelled: set[int] = set()
        self.responses: list[Response] = []
        self.stats: deque[IterationStats] = deque(maxlen=_STATS_KEPT)
        self.stopping = False
        self.running: list[_Running] = []
        self.free_blocks = self.total_blocks
        self.thread = threading.Thread(target=self.run, name="fake-trtllm-executor", daemon=True)

    # ------------------------------------------------------------------ worker

    def run(self) -> None:
        while True:
            with self.cond:
                while not (self.stopping or self.queue or self.running or self.cancelled):
                    self.cond.wait()
                if self.stopping:
                    return
                cancelled, self.cancelled = self.cancelled, set()
            out: list[Response] = []
            self._cancel(cancelled, out)
            self._admit(out)
            self._iterate(out)
            with self.cond:
                self.responses.extend(out)
                self.stats.append(self._iteration_stats())
                self.cond.notify_all()
            time.sleep(self.limits.iteration_s)

    def _cancel(self, ids: set[int], out: list[Response]) -> None:
        with self.cond:
            queued = [item for item in self.queue if item[0] in ids]
            for item in queued:
                self.queue.remove(item)
        for engine_id, _ in queued:
            out.append(_final(engine_id, [], None, FinishReason.CANCELLED))
        for running in [r for r in self.running if r.engine_id in ids]:
            self._finish(running)
            out.append(_final(running.engine_id, [], None, FinishReason.CANCELLED))

    def _admit(self, out: list[Response]) -> None:
        while len(self.running) < self.max_batch_size:
            with self.cond:
                if not self.queue:
                    return
                engine_id, request = self.queue[0]
            error = self._invalid(request)
            need = self._blocks_for(len(request.input_token_ids) + request.max_tokens)
            if error is None and need > self.total_blocks:
                error = f"Request needs {need} KV cache blocks; the cache holds {self.total_blocks}"
            if error is None and need > self.free_blocks:
                return  # waits, in order, for blocks to free up
            with self.cond:
                self.queue.popleft()
            if error is not None:
                out.append(Response._make(engine_id, None, error))
                continue
            self.free_blocks -= need
            self.running.append(
                _Running(
                    engine_id,
                    request,
                    Sampler(request.sampling_config),
                    list(request.input_token_ids),
                    need,
                )
            )

    def _invalid(self, request: Request) -> str | None:
        n, limits = len(request.input_token_ids), self.limits
        if n == 0:
            return "Input length must be at least 1"
        if n > limits.max_input_len:
            return f"Prompt length ({n}) exceeds maximum input length ({limits.max_input_len})."
        if request.max_tokens < 1:
            return f"max_tokens must be at least 1, got {request.max_tokens}"
        if n + request.max_tokens > limits.max_seq_len:
            return (
                f"Prompt length + number of requested output tokens ({n} + "
                f"{request.max_tokens}) exceeds maximum sequence length ({limits.max_seq_len})."
            )
        bad = [t for t in request.input_token_ids if not 0 <= t < limits.vocab_size]
        if bad:
            return f"Token id {bad[0]} is outside the vocabulary of {limits.vocab_size}"
        return None

    def _iterate(self, out: list[Response]) -> None:
        budget = self.max_num_tokens
        for running in list(self.running):
            remaining = len(running.context) - running.computed
            if remaining > 0:
                if self.config.enable_chunked_context:
                    chunk = min(remaining, budget)
                else:
                    chunk = remaining if remaining <= budget else 0
                running.computed += chunk
                budget -= chunk
                if running.computed < len(running.context):
                    continue
            elif budget < 1:
                continue
            else:
                budget -= 1
            out.append(self._generate(running))

    def _generate(self, running: _Running) -> Response:
        request, engine_id = running.request, running.engine_id
        fail = self.limits.fail_token_id
        if running.output and fail is not None and fail in request.input_token_ids:
            self._finish(running)
            return Response._make(engine_id, None, f"Encountered an error in forward: token {fail}")
        token, logprob = running.sampler.sample(
            next_token_logits(running.context, self.limits.vocab_size)
        )
        new: list[int] = []
        reason = FinishReason.NOT_FINISHED
        if request.end_id is not None and request.end_id != -1 and token == request.end_id:
            reason = FinishReason.END_ID  # the end id is left out of the output
        else:
            running.context.append(token)
            running.output.append(token)
            running.logprobs.append(logprob)
            new = [token]
            if any(w and running.output[-len(w) :] == w for w in request.stop_words or []):
                reason = FinishReason.STOP_WORDS
            elif len(running.output) >= request.max_tokens:
                reason = FinishReason.LENGTH
        running.computed = len(running.context)
        if not request.output_config.exclude_input_from_output and not running.sent_input:
            new = list(request.input_token_ids) + new
        running.sent_input = True
        if reason != FinishReason.NOT_FINISHED:
            self._finish(running)
        logprobs = list(running.logprobs) if request.output_config.return_log_probs else None
        result = Result()
        result.is_final = reason != FinishReason.NOT_FINISHED
        result.output_token_ids = [new]
        result.log_probs = [logprobs] if logprobs is not None else None
        result.finish_reasons = [reason]
        return Response._make(engine_id, result, None)

    def _finish(self, running: _Running) -> None:
        self.running.remove(running)
        self.free_blocks += running.blocks

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.limits.tokens_per_block)

    def _iteration_stats(self) -> IterationStats:
        kv = KvCacheStats()
        kv.max_num_blocks = self.total_blocks
        kv.tokens_per_block = self.limits.tokens_per_block
        stats = IterationStats()
        stats.kv_cache_stats = kv
        return stats

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()


def _final(
    engine_id: int, tokens: list[int], logprobs: list[float] | None, reason: FinishReason
) -> Response:
    result = Result()
    result.is_final = True
    result.output_token_ids = [tokens]
    result.log_probs = [logprobs] if logprobs is not None else None
    result.finish_reasons = [reason]
    return Response._make(engine_id, result, None)


class Executor:
    """The subset of ``tensorrt_llm.bindings.executor.Executor`` the adapter uses."""

    def __init__(
        self, *, model_path: Any, model_type: ModelType, executor_config: ExecutorConfig
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
        engine = _Engine(EngineLimits.read(path), executor_config)
        self._engine = engine
        self._next_id = 1
        self._shut_down = False
        # The worker holds no reference to this object, so a dropped executor stops it.
        weakref.finalize(self, engine.stop)
        engine.thread.start()

    def enqueue_request(self, request: Request) -> int:
        if not isinstance(request, Request):
            raise TypeError(f"enqueue_request(): {request!r} is not a Request")
        self._check_open()
        engine_id, self._next_id = self._next_id, self._next_id + 1
        with self._engine.cond:
            self._engine.queue.append((engine_id, request))
            self._engine.cond.notify_all()
        return engine_id

    def await_responses(self, timeout: timedelta | None = None) -> list[Response]:
        """Every response ready, waiting up to ``timeout`` for the first (forever if
        ``None``); an empty list on timeout."""
        if timeout is not None and not isinstance(timeout, timedelta):
            raise TypeError(f"await_responses(): timeout={timeout!r} is not a datetime.timedelta")
        self._check_open()
        engine = self._engine
        with engine.cond:
            engine.cond.wait_for(
                lambda: bool(engine.responses) or engine.stopping,
                None if timeout is None else timeout.total_seconds(),
            )
            ready, engine.responses = engine.responses, []
        return ready

    def cancel_request(self, id: int) -> None:
        self._check_open()
        with self._engine.cond:
            self._engine.cancelled.add(id)
            self._engine.cond.notify_all()

    def get_latest_iteration_stats(self) -> list[IterationStats]:
        self._check_open()
        with self._engine.cond:
            stats = list(self._engine.stats)
            self._engine.stats.clear()
        return stats

    def shutdown(self) -> None:
        self._engine.stop()
        if self._engine.thread is not threading.current_thread():
            self._engine.thread.join()
        self._shut_down = True

    def _check_open(self) -> None:
        if self._shut_down:
            raise RuntimeError("[TensorRT-LLM][ERROR] the executor has been shut down")
