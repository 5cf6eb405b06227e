"""A fake of TensorRT-LLM's PyTorch-backend executor loop, for the in-executor scheduler.

What each part reproduces (sources read on NVIDIA/TensorRT-LLM):

- ``SchedulerOutput``: the namedtuple of ``tensorrt_llm/_torch/pyexecutor/scheduler.py``
  at ``034fffb0`` (1.2 line, five fields) or of ``scheduler/scheduler.py`` at
  ``002f3cc3`` (1.3 line, ``encoder_requests`` first, ``scheduled_mm_encoder_items``
  last with default ``None``); ``OUTPUT_TYPES`` has both.
- ``LlmRequestState``: the states the schedulers compare, ordered by value as
  ``PyCapacityScheduler`` (scheduler.py at ``034fffb0``) relies on
  (``state.value < no_schedule_until_state.value``...).
- ``FakeLlmRequest``: ``py_request_id``, ``state``, ``get_tokens(0)``,
  ``get_num_tokens(0)``, ``prompt_len``, ``max_new_tokens``, ``context_current_position``,
  ``context_chunk_size`` (settable), ``context_remaining_length``,
  ``is_last_context_chunk``, ``is_first_context_chunk``; ``pause(max_input_len)`` as
  C++ ``LlmRequest::pause`` (``cpp/include/tensorrt_llm/batch_manager/llmRequest.h``,
  stored copies): the prompt becomes ``min(max_input_len, prompt_len + generated)``
  tokens, generated tokens move into it, and the request starts again as a context
  request at position 0 (its remaining new tokens shrink by what moved).
- ``FakeKvCacheManager``: ``prepare_resources`` of
  ``tensorrt_llm/_torch/pyexecutor/resource_manager.py`` (stored copies): on a context
  request's first chunk ``add_sequence(py_request_id, prompt_len)`` allocates blocks
  for the whole prompt; each generation request ``add_token``s, taking a block when the
  last is full; allocation beyond the pool raises (the C++ manager throws);
  ``get_kv_cache_stats()`` gives ``max_num_blocks``, ``free_num_blocks``,
  ``tokens_per_block``. Block reuse is off (as in-executor mode runs it).
- ``FakePyExecutor.iterate``: the order of ``PyExecutor._executor_loop`` without the
  overlap scheduler (``py_executor.py``, stored copies): fetch new requests into
  ``active_requests``; ``_schedule`` (``scheduler.schedule_request(active_requests,
  inflight_req_ids)``); ``_pause_requests`` (``req.pause(max_input_len)`` then free its
  resources); ``prepare_resources`` (KV for the batch); forward (each context request
  advances by its chunk); sample (a context request on its last chunk and every
  generation request gain one token); requests that reached ``max_new_tokens`` end
  (``GENERATION_COMPLETE``, resources freed, removed from ``active_requests``).
- ``cancel`` (what the LLM API's ``RequestOutput.abort()`` asks of the executor; the
  path between them was not re-read): ``PyExecutor.cancel_request(id)`` only records
  the id (``canceled_req_ids``; ``py_executor.py`` at ``9521caf4``, the oldest stored
  copy). ``_executor_loop`` handles it after sampling, in an
  iteration that ran a batch only (``if can_queue: ... _handle_canceled_requests();
  _handle_responses()``, stored copy with ``_prepare_and_schedule_batch``; the index
  exposes no commit): every active request with that id, scheduled or not, is
  ``finish_by_reason(CANCELLED)`` and ``_handle_responses`` terminates it (resources
  freed) and drops it from ``active_requests`` (both at ``0004396``).
- ``FakeDist`` / two ranks: every rank runs the same loop over its own copies of the
  requests; ``broadcast(obj, root=0)`` hands rank 0's object to the others.
"""

from __future__ import annotations

import enum
from collections import namedtuple
from collections.abc import Callable
from typing import Any

OUTPUT_TYPES = {
    "1.2": namedtuple(
        "SchedulerOutput",
        [
            "context_requests",
            "generation_requests",
            "paused_requests",
            "fitting_disagg_gen_init_requests",
            "num_fitting_requests",
        ],
    ),
    "1.3": namedtuple(
        "SchedulerOutput",
        [
            "encoder_requests",
            "context_requests",
            "generation_requests",
            "paused_requests",
            "fitting_disagg_gen_init_requests",
            "num_fitting_requests",
            "scheduled_mm_encoder_items",
        ],
        defaults=[None],
    ),
}


class LlmRequestState(enum.Enum):
    UNKNOWN = 0
    ENCODER_INIT = 1
    CONTEXT_INIT = 2
    GENERATION_IN_PROGRESS = 3
    GENERATION_TO_COMPLETE = 4
    GENERATION_COMPLETE = 5


class FakeLlmRequest:
    """One request as the executor holds it (single beam)."""

    def __init__(self, request_id: int, prompt: list[int], max_new_tokens: int) -> None:
        self.py_request_id = request_id
        self.py_client_id = request_id
        self.request_id = request_id
        self.tokens = list(prompt)
        self.prompt_len = len(prompt)
        self.max_new_tokens = max_new_tokens
        self.state = LlmRequestState.CONTEXT_INIT
        self.context_current_position = 0
        self.context_chunk_size = self.prompt_len
        self.num_generated = 0  # since the last pause

    def get_tokens(self, beam: int) -> list[int]:
        return self.tokens

    def get_num_tokens(self, beam: int) -> int:
        return len(self.tokens)

    @property
    def context_remaining_length(self) -> int:
        return self.prompt_len - self.context_current_position

    @property
    def is_first_context_chunk(self) -> bool:
        return self.context_current_position == 0

    @property
    def is_last_context_chunk(self) -> bool:
        return self.context_current_position + self.context_chunk_size >= self.prompt_len

    def pause(self, max_input_len: int) -> None:
        new_prompt_len = min(max_input_len, self.prompt_len + self.num_generated)
        del self.tokens[new_prompt_len:]
        self.max_new_tokens -= new_prompt_len - self.prompt_len
        self.prompt_len = new_prompt_len
        self.num_generated = 0
        self.state = LlmRequestState.CONTEXT_INIT
        self.context_current_position = 0
        self.context_chunk_size = new_prompt_len


class KvStats:
    def __init__(self, max_num_blocks: int, free_num_blocks: int, tokens_per_block: int) -> None:
        self.max_num_blocks = max_num_blocks
        self.free_num_blocks = free_num_blocks
        self.tokens_per_block = tokens_per_block


class KvAllocationError(RuntimeError):
    """The pool cannot hold what was asked (the C++ manager throws)."""


class FakeKvCacheManager:
    def __init__(self, num_blocks: int, tokens_per_block: int) -> None:
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.blocks: dict[int, int] = {}  # request id -> blocks held
        self.tokens: dict[int, int] = {}  # request id -> tokens with KV slots

    @property
    def num_free(self) -> int:
        return self.num_blocks - sum(self.blocks.values())

    def _grow(self, rid: int, num_tokens: int) -> None:
        need = -(-num_tokens // self.tokens_per_block) - self.blocks.get(rid, 0)
        if need > self.num_free:
            raise KvAllocationError(f"request {rid}: needs {need} blocks, {self.num_free} free")
        self.blocks[rid] = self.blocks.get(rid, 0) + max(need, 0)
        self.tokens[rid] = num_tokens

    def add_sequence(self, rid: int, prompt_len: int) -> None:
        if rid in self.blocks:
            raise KvAllocationError(f"request {rid} is already a sequence")
        self._grow(rid, prompt_len)

    def add_token(self, rid: int) -> None:
        self._grow(rid, self.tokens[rid] + 1)

    def prepare_resources(
        self, context: list[FakeLlmRequest], generation: list[FakeLlmRequest]
    ) -> None:
        for req in context:
            if req.is_first_context_chunk:
                self.add_sequence(req.py_request_id, req.prompt_len)
        for req in generation:
            self.add_token(req.py_request_id)

    def free_resources(self, req: FakeLlmRequest) -> None:
        self.blocks.pop(req.py_request_id, None)
        self.tokens.pop(req.py_request_id, None)

    def get_kv_cache_stats(self) -> KvStats:
        return KvStats(self.num_blocks, self.num_free, self.tokens_per_block)


Sampler = Callable[[FakeLlmRequest], int]


def position_sampler(vocab: int) -> Sampler:
    """The token the sim executor gives a request whose next position is ``p``: ``p %
    vocab`` (so both sides of the comparison see the same tokens)."""
    return lambda req: len(req.tokens) % vocab


class FakePyExecutor:
    """The executor loop of one rank, driving ``scheduler`` (a ``RequestScheduler``).

    ``submit`` queues a request for the next iteration's fetch; ``iterate`` runs one
    iteration and returns the ``SchedulerOutput`` the scheduler gave; ``finished`` holds
    every ended request by id. ``max_input_len`` is the cap ``pause`` applies.
    ``on_allocated`` runs after the batch's KV is allocated, ``on_iteration`` after the
    iteration (with the scheduler's output).
    """

    def __init__(
        self,
        scheduler: Any,
        kv: FakeKvCacheManager,
        sampler: Sampler,
        *,
        max_input_len: int = 1 << 20,
        on_iteration: Callable[[Any], None] | None = None,
        on_allocated: Callable[[], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.kv = kv
        self.sampler = sampler
        self.max_input_len = max_input_len
        self.on_iteration = on_iteration
        self.on_allocated = on_allocated
        self.active_requests: list[FakeLlmRequest] = []
        self.inflight_req_ids: set[int] = set()
        self.finished: dict[int, FakeLlmRequest] = {}
        self.canceled_req_ids: set[int] = set()
        self._queue: list[FakeLlmRequest] = []

    def submit(self, request: FakeLlmRequest) -> None:
        self._queue.append(request)

    def cancel(self, request_id: int) -> None:
        """Cancel a request (``cancel_request``): it leaves ``active_requests`` with its
        KV freed at the end of the next iteration that runs a batch."""
        self.canceled_req_ids.add(request_id)

    def _handle_canceled_requests(self) -> None:
        for req in [r for r in self.active_requests if r.py_request_id in self.canceled_req_ids]:
            self._end(req)
        self.canceled_req_ids.clear()

    def iterate(self) -> Any:
        self.active_requests.extend(self._queue)  # _fetch_new_requests
        self._queue = []
        out = self.scheduler.schedule_request(self.active_requests, self.inflight_req_ids)
        for req in out.paused_requests:  # _pause_requests
            req.pause(self.max_input_len)
            self.kv.free_resources(req)
        context, generation = list(out.context_requests), list(out.generation_requests)
        self.kv.prepare_resources(context, generation)
        if self.on_allocated is not None:
            self.on_allocated()
        sampled = []
        for req in context:  # forward, then sample
            last = req.is_last_context_chunk
            req.context_current_position += req.context_chunk_size
            if last:
                sampled.append(req)
                req.state = LlmRequestState.GENERATION_IN_PROGRESS
        self._sample(sampled + generation)
        if context or generation:  # can_queue: the batch ran
            self._handle_canceled_requests()
        if self.on_iteration is not None:
            self.on_iteration(out)
        return out

    def _sample(self, sampled: list[FakeLlmRequest]) -> None:
        for req in sampled:
            req.tokens.append(self.sampler(req))
            req.num_generated += 1
            if req.num_generated >= req.max_new_tokens:
                self._end(req)

    def _end(self, req: FakeLlmRequest) -> None:
        req.state = LlmRequestState.GENERATION_COMPLETE
        self.kv.free_resources(req)
        self.active_requests.remove(req)
        self.finished[req.py_request_id] = req

    def has_work(self) -> bool:
        return bool(self.active_requests or self._queue)


class FakeDist:
    """``broadcast(obj, root=0)`` between ranks that call it in turn: rank 0's call
    stores the object for the iteration, the others' calls return it."""

    def __init__(self) -> None:
        self._value: Any = None

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        if obj is not None:
            self._value = obj
        return self._value
