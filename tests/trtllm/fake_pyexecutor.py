"""A fake of TensorRT-LLM's PyTorch-backend executor loop, for the in-executor scheduler.

What each part reproduces (sources read on NVIDIA/TensorRT-LLM):

- ``SchedulerOutput``: the namedtuple of ``tensorrt_llm/_torch/pyexecutor/scheduler.py``
  at ``034fffb0`` (1.2 line, five fields) or of ``scheduler/scheduler.py`` at
  ``002f3cc3`` (1.3 line, ``encoder_requests`` first, ``scheduled_mm_encoder_items``
  last with default ``None``); ``OUTPUT_TYPES`` has both, and the 1.3 line's five-field
  form (``scheduler/scheduler.py`` at ``5f480b7a``).
- ``LlmRequestState``: the states the schedulers compare, ordered by value as
  ``PyCapacityScheduler`` (scheduler.py at ``034fffb0``) relies on
  (``state.value < no_schedule_until_state.value``...).
- ``FakeLlmRequest``: ``py_request_id``, ``state``, ``get_tokens(0)`` (a new list each
  call, as the binding of C++ ``getTokens(beam)`` returns a copy; counted in
  ``num_token_copies``), ``get_last_tokens(0)`` (the last token alone, C++
  ``getLastTokens(beam)``; ``py_executor.py`` at ``9521caf4`` reads a request's newest
  token this way, ``req.get_last_tokens(0)``),
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
- context chunks: TensorRT-LLM's own scheduler makes every chunk but a prompt's last a
  multiple of ``chunk_unit_size`` (``tokens_per_block``; ``_util.py``, stored copy;
  ``cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp`` at ``0a949d31``,
  FIRST_COME_FIRST_SERVED: ``actualChunkSize / chunkUnitSize * chunkUnitSize`` when the
  chunk does not end the prompt), so its model engine only ever runs such chunks; the
  fake records any other as ``(request id, position, chunk)`` in ``unaligned_chunks``.
- the forward pass's token limit: the model engine asserts ``total_num_tokens <=
  self.max_num_tokens`` (``model_engine.py``, ``_prepare_tp_inputs``, stored copies)
  and ``_forward_step`` answers any exception with ``_handle_errors(error_msg)``, which
  ends every active request with that error (``py_executor.py`` at ``9521caf4``):
  ``max_num_tokens`` (``None``: unchecked) and ``errors``.
- batch waiting (``enable_batch_waiting``: ``batch_wait_timeout_iters`` or
  ``batch_wait_max_tokens_ratio`` set): ``PyExecutor._schedule`` passes the scheduler's
  context requests through ``_waiting_requests`` whenever generation requests are
  scheduled too, which returns none of them until enough tokens are scheduled or the
  wait times out (``py_executor.py``, stored copy with ``_prepare_and_schedule_batch``);
  here they always wait.
- ``cancel`` (what the LLM API's ``RequestOutput.abort()`` asks of the executor; the
  path between them was not re-read): ``PyExecutor.cancel_request(id)`` only records
  the id (``canceled_req_ids``; ``py_executor.py`` at ``9521caf4``, the oldest stored
  copy). ``_executor_loop`` handles it after sampling, in an
  iteration that ran a batch only (``if can_queue: ... _handle_canceled_requests();
  _handle_responses()``, stored copy with ``_prepare_and_schedule_batch``; the index
  exposes no commit): every active request with that id, scheduled or not, is
  ``finish_by_reason(CANCELLED)`` and ``_handle_responses`` terminates it (resources
  freed) and drops it from ``active_requests`` (both at ``0004396``).
- ``FakeGuidedDecoder``: ``GuidedDecoder._build`` of
  ``tensorrt_llm/_torch/pyexecutor/guided_decoder.py`` at ``40bb912b``, with a literal
  grammar (``guided_decoding_params``: the exact token sequence the output must be). A
  request in its last context chunk gets a fresh matcher at the grammar's start
  (``require_matcher_init``), whatever tokens its context already holds; a generation
  request's matcher accepts its newest token first (``require_matcher_advance``,
  ``accept_token(get_last_tokens(0))``; a token it does not accept raises ``ValueError``
  as the real one does); the sampled token is the one the matcher's bitmask allows. So a
  request paused after some output comes back as a context request and starts its
  grammar again.
- ``FakeDist`` / two ranks: every rank runs the same loop over its own copies of the
  requests; ``broadcast(obj, root=0)`` hands rank 0's object to the others.
"""

from __future__ import annotations

import abc
import enum
import threading
import types
from collections import namedtuple
from collections.abc import Callable
from typing import Any

# PyExecutor.__init__'s max_input_len default (py_executor.py at 9521caf4), which
# _pause_requests passes to req.pause; create_py_executor_instance never passes one (the
# PyExecutor(...) call of _util.py, stored copies). Newer code pauses for recompute with
# _UNBOUNDED_PAUSE_MAX_INPUT_LEN = 0x7fffffff instead, "instead of inheriting TRT
# build-time max_input_len truncation" (py_executor.py at 0004396).
PAUSE_MAX_INPUT_LEN = 2048
CREATOR_MODULE = "tensorrt_llm._torch.pyexecutor.py_executor_creator"
UTIL_MODULE = "tensorrt_llm._torch.pyexecutor._util"

# The five fields of the 1.2 line's tuple (scheduler.py at 034fffb0), which the 1.3
# line's scheduler/ package has too at 5f480b7a (scheduler/scheduler.py).
FIVE_OUTPUT_FIELDS = [
    "context_requests",
    "generation_requests",
    "paused_requests",
    "fitting_disagg_gen_init_requests",
    "num_fitting_requests",
]
OUTPUT_TYPES = {
    "1.2": namedtuple("SchedulerOutput", FIVE_OUTPUT_FIELDS),
    "1.3": namedtuple(
        "SchedulerOutput",
        ["encoder_requests", *FIVE_OUTPUT_FIELDS, "scheduled_mm_encoder_items"],
        defaults=[None],
    ),
    "1.3@5f480b7a": namedtuple("SchedulerOutput", FIVE_OUTPUT_FIELDS),
}


class RequestScheduler(abc.ABC):
    """TensorRT-LLM's scheduler base (``scheduler.py`` at ``034fffb0``): an ABC with the
    abstract ``schedule_request(active_requests, inflight_request_ids)`` and
    ``can_schedule(requests)``, no ``__init__`` and no state."""

    @abc.abstractmethod
    def schedule_request(self, active_requests: Any, inflight_request_ids: Any) -> Any: ...

    @abc.abstractmethod
    def can_schedule(self, requests: Any) -> bool: ...


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
        self.num_token_copies = 0  # get_tokens calls (each copies the sequence)

    def get_tokens(self, beam: int) -> list[int]:
        # The binding converts the C++ vector into a new list: a copy of every token.
        self.num_token_copies += 1
        return list(self.tokens)

    def get_last_tokens(self, beam: int) -> int:
        return self.tokens[-1]

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


class FakeGuidedDecoder:
    """TensorRT-LLM's guided decoder (module docstring) over literal grammars: a
    request's ``guided_decoding_params`` is the token sequence its output must be."""

    def __init__(self) -> None:
        self.matchers: dict[int, int] = {}  # request id -> grammar tokens accepted

    def build(self, context: list[FakeLlmRequest], generation: list[FakeLlmRequest]) -> None:
        for req in context:
            if _grammar(req) is not None and req.is_last_context_chunk:
                self.matchers[req.py_request_id] = 0  # require_matcher_init: a fresh matcher
        for req in generation:
            grammar = _grammar(req)
            if grammar is None:
                continue
            position = self.matchers[req.py_request_id]
            if position < len(grammar):  # matcher.is_terminated() otherwise
                token = req.get_last_tokens(0)
                if token != grammar[position]:
                    raise ValueError(
                        f"Request {req.py_request_id} failed to accept last new token: {token}."
                    )
                self.matchers[req.py_request_id] = position + 1

    def allowed(self, req: FakeLlmRequest, token: int) -> int:
        """The token sampled under the bitmask: the grammar's next while it has one."""
        grammar = _grammar(req)
        if grammar is None:
            return token
        position = self.matchers[req.py_request_id]
        return grammar[position] if position < len(grammar) else token


def _grammar(req: FakeLlmRequest) -> tuple[int, ...] | None:
    return getattr(req, "guided_decoding_params", None)


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
        max_input_len: int = PAUSE_MAX_INPUT_LEN,
        on_iteration: Callable[[Any], None] | None = None,
        on_allocated: Callable[[], None] | None = None,
        max_num_tokens: int | None = None,
        enable_batch_waiting: bool = False,
        guided: FakeGuidedDecoder | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.guided = guided
        self.max_num_tokens = max_num_tokens
        self.enable_batch_waiting = enable_batch_waiting
        self.errors: dict[int, str] = {}  # requests _handle_errors ended, with the message
        self.kv = kv
        self.sampler = sampler
        self.max_input_len = max_input_len
        self.unaligned_chunks: list[tuple[int, int, int]] = []
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

    def _fetch(self) -> None:
        self.active_requests.extend(self._queue)  # _fetch_new_requests
        self._queue = []

    def iterate(self) -> Any:
        self._fetch()
        out = self.scheduler.schedule_request(self.active_requests, self.inflight_req_ids)
        for req in out.paused_requests:  # _pause_requests
            req.pause(self.max_input_len)
            self.kv.free_resources(req)
        context, generation = list(out.context_requests), list(out.generation_requests)
        if self.enable_batch_waiting and context and generation:
            context = []  # _waiting_requests: the context requests wait for a fuller batch
        self.kv.prepare_resources(context, generation)
        if self.on_allocated is not None:
            self.on_allocated()
        num_tokens = sum(r.context_chunk_size for r in context) + len(generation)
        if self.max_num_tokens is not None and num_tokens > self.max_num_tokens:
            self._handle_errors(
                f"total_num_tokens ({num_tokens}) should be less than or equal to "
                f"max_num_tokens ({self.max_num_tokens})"
            )
            return out
        if self.guided is not None:
            self.guided.build(context, generation)
        sampled = []
        for req in context:  # forward, then sample
            last = req.is_last_context_chunk
            if not last and req.context_chunk_size % self.kv.tokens_per_block:
                self.unaligned_chunks.append(
                    (req.py_request_id, req.context_current_position, req.context_chunk_size)
                )
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

    def _handle_errors(self, error_msg: str) -> None:
        """The forward pass raised: every active request ends with the error."""
        for req in list(self.active_requests):
            self.errors[req.py_request_id] = error_msg
            self._end(req)

    def _sample(self, sampled: list[FakeLlmRequest]) -> None:
        for req in sampled:
            token = self.sampler(req)
            if self.guided is not None:
                token = self.guided.allowed(req, token)
            req.tokens.append(token)
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


class FakeSimpleScheduler:
    """TensorRT-LLM's own scheduler (``SimpleScheduler(capacity_scheduler,
    mb_scheduler)`` built by ``create_py_executor_instance``; ``scheduler.py`` at
    ``034fffb0``) as far as the KV estimation pass needs it: every context request with
    its whole remaining prompt as one chunk (each dummy prompt fits ``max_num_tokens``),
    every generation request, nothing paused. ``output_type``: the release's
    ``SchedulerOutput``."""

    def __init__(self, output_type: Any) -> None:
        self.output_type = output_type

    def schedule_request(self, active_requests: list[FakeLlmRequest], inflight: Any) -> Any:
        context = [r for r in active_requests if r.state == LlmRequestState.CONTEXT_INIT]
        for req in context:
            req.context_chunk_size = req.context_remaining_length
        generation = [
            r for r in active_requests if r.state == LlmRequestState.GENERATION_IN_PROGRESS
        ]
        values = {
            "encoder_requests": [],
            "context_requests": context,
            "generation_requests": generation,
            "paused_requests": [],
            "fitting_disagg_gen_init_requests": [],
            "num_fitting_requests": len(context) + len(generation),
            "scheduled_mm_encoder_items": None,
        }
        return self.output_type(**{name: values[name] for name in self.output_type._fields})


class FakeWorkerExecutor(FakePyExecutor):
    """A ``PyExecutor`` whose loop runs on a thread of its own, as
    ``create_py_executor_instance`` builds it (``start_worker=False``) and
    ``configure_kv_cache_capacity`` starts it (``py_executor.py`` at ``9521caf4``):
    ``enqueue_requests`` queues prompts and returns their ids; ``start_worker`` starts
    the loop, which waits for requests only while ``active_requests`` is empty
    (``_fetch_new_requests``: timeout ``None``, else 0) and otherwise iterates without
    pause; ``await_responses(ids)`` blocks, with no timeout, until every id has its final
    response (here: it ended); ``shutdown`` stops the loop once nothing is active (the
    loop runs ``while not self.is_shutdown or len(self.active_requests) > 0``).
    ``scheduler`` starts as TensorRT-LLM's own (``FakeSimpleScheduler``); ``dist``,
    ``disable_overlap_scheduler``, ``enable_attention_dp`` and
    ``resource_manager.resource_managers[kv_key]`` are what the installer reads."""

    def __init__(
        self,
        kv: FakeKvCacheManager,
        output_type: Any,
        dist: Any,
        kv_key: Any = "KV",
        *,
        max_input_len: int = PAUSE_MAX_INPUT_LEN,
    ) -> None:
        super().__init__(
            FakeSimpleScheduler(output_type),
            kv,
            position_sampler(1000),
            max_input_len=max_input_len,
        )
        self.dist = dist
        self.disable_overlap_scheduler = True
        self.enable_attention_dp = False
        self.resource_manager = types.SimpleNamespace(resource_managers={kv_key: kv})
        self._cv = threading.Condition()
        self._next_id = 1
        self._shutdown = False
        self._thread: threading.Thread | None = None

    def enqueue_requests(
        self, prompts: list[list[int]], max_tokens: int = 1, client_ids: list[int] | None = None
    ) -> list[int]:
        """Queue ``prompts`` (``client_ids``: the ids the LLM API's results carry, kept as
        ``py_client_id``; by default the request ids); returns the request ids."""
        with self._cv:
            ids = []
            for i, prompt in enumerate(prompts):
                req = FakeLlmRequest(self._next_id, list(prompt), max_tokens)
                if client_ids is not None:
                    req.py_client_id = client_ids[i]
                self._queue.append(req)
                ids.append(self._next_id)
                self._next_id += 1
            self._cv.notify_all()
            return ids

    def _fetch(self) -> None:
        with self._cv:
            super()._fetch()

    def start_worker(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fake-executor", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._queue or self.active_requests or self._shutdown):
                    self._cv.wait()
                if self._shutdown and not (self._queue or self.active_requests):
                    return
            self.iterate()
            with self._cv:
                self._cv.notify_all()

    def await_responses(self, ids: list[int]) -> None:
        with self._cv:
            self._cv.wait_for(lambda: all(i in self.finished for i in ids))

    def shutdown(self) -> None:
        with self._cv:
            self._shutdown = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()


class FakeKvCacheCreator:
    """``KvCacheCreator`` (``tensorrt_llm/_torch/pyexecutor/_util.py``, stored copies:
    the class and its ``configure_kv_cache_capacity(py_executor)`` are in every one
    read) as far as the scheduler meets it. ``_create_dummy_context_requests(
    max(1, net_max_seq_len - 1))``: prompts of ``min(max_num_tokens, net_max_seq_len -
    1)`` tokens (the last one shorter) until ``max_num_tokens`` tokens in all, each with
    ``max_tokens=1``; ``net_max_seq_len`` is the executor's ``max_seq_len`` when set,
    else the model's own. ``_get_token_num_for_estimation``: a pool exactly for them
    (each prompt plus one token, rounded up to whole blocks). ``configure_kv_cache_
    capacity``: enqueue them, ``start_worker()``, ``await_responses(req_ids)`` with no
    timeout, then ``shutdown()``; ``LLM()`` does not return before it does."""

    def __init__(self, *, max_num_tokens: int, net_max_seq_len: int, tokens_per_block: int) -> None:
        self.max_num_tokens = max_num_tokens
        self.net_max_seq_len = net_max_seq_len
        self.tokens_per_block = tokens_per_block

    def dummy_prompts(self) -> list[list[int]]:
        length = min(self.max_num_tokens, max(1, self.net_max_seq_len - 1))
        prompts, remaining = [], self.max_num_tokens
        while remaining > 0:
            n = min(length, remaining)
            prompts.append([(7 * i) % 997 + 1 for i in range(n)])
            remaining -= n
        return prompts

    def estimation_blocks(self) -> int:
        return sum(-(-(len(p) + 1) // self.tokens_per_block) for p in self.dummy_prompts())

    def configure_kv_cache_capacity(self, py_executor: FakeWorkerExecutor) -> None:
        req_ids = py_executor.enqueue_requests(self.dummy_prompts(), max_tokens=1)
        py_executor.start_worker()
        try:
            py_executor.await_responses(req_ids)
        finally:
            py_executor.shutdown()


def create_py_executor(
    import_module: Callable[[str], Any],
    *,
    max_num_tokens: int,
    max_seq_len: int | None,
    model_max_seq_len: int,
    num_blocks: int,
    tokens_per_block: int,
) -> Any:
    """``py_executor_creator.create_py_executor`` with KV estimation on (the default
    without context parallelism, ``try_prepare_estimation``; stored copies): build an
    executor over the estimation pool through ``create_py_executor_instance``, run
    ``KvCacheCreator.configure_kv_cache_capacity`` on it, drop it, then build the
    serving executor over ``num_blocks`` blocks and start it. Both names are looked up
    at call time on their module and class (``_util``'s ``KvCacheCreator``, imported
    by ``py_executor_creator``), as the wraps that replace them need."""
    creator = import_module(CREATOR_MODULE)
    util = import_module(UTIL_MODULE)
    kv_creator = util.KvCacheCreator(
        max_num_tokens=max_num_tokens,
        net_max_seq_len=max_seq_len or model_max_seq_len,
        tokens_per_block=tokens_per_block,
    )
    estimation = creator.create_py_executor_instance(
        num_blocks=kv_creator.estimation_blocks(), tokens_per_block=tokens_per_block
    )
    kv_creator.configure_kv_cache_capacity(estimation)
    py_executor = creator.create_py_executor_instance(
        num_blocks=num_blocks, tokens_per_block=tokens_per_block
    )
    py_executor.start_worker()
    return py_executor


class FakeDist:
    """``broadcast(obj, root=0)`` between ranks that call it in turn: rank 0's call
    stores the object for the iteration, the others' calls return it."""

    def __init__(self) -> None:
        self._value: Any = None

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        if obj is not None:
            self._value = obj
        return self._value
