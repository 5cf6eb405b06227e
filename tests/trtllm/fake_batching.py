"""In-flight batching over the fake model, shared by both TensorRT-LLM fakes.

A worker thread runs iterations as TensorRT-LLM's runtimes do: each iteration admits
queued requests under the capacity policy, gives every scheduled request its next
context chunk or one decode token within the ``max_num_tokens`` budget, and reports what
each request produced as ``Event``s (and the KV cache picture as ``KvPicture``).

Capacity policies follow ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``:

- ``GUARANTEED_NO_EVICT``: a request starts only when the blocks for its whole lifetime
  (input plus ``max_tokens``) are free beyond what the running requests may still use;
  requests start in order and the first that does not fit holds back the rest.
- ``STATIC_BATCH``: as ``GUARANTEED_NO_EVICT``, but new requests start only when none
  runs.
- ``MAX_UTILIZATION``: nothing is reserved; each iteration every request needs blocks
  for the tokens it holds plus the next one, and when one cannot get them the most
  recently started request is paused: its blocks are freed and its tokens (prompt and
  output so far) are recomputed when it is scheduled again. Its output continues.

Requests are validated when first admitted; an invalid one ends with an error event.
``fail_token_id`` (a request whose input holds it fails after its first output token)
stands in for a run-time error.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.trtllm.fake_model import Sampler, next_token_logits

POLICIES = ("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH")


@dataclass(frozen=True)
class Limits:
    """What the fake runtime runs with (tokens; sequences for ``max_batch_size``;
    seconds for ``iteration_s``)."""

    max_batch_size: int
    max_num_tokens: int
    max_input_len: int
    max_seq_len: int
    tokens_per_block: int
    vocab_size: int
    kv_blocks: int
    iteration_s: float
    chunked_context: bool
    policy: str
    fail_token_id: int | None = None
    priority_queue: bool = False  # waiting queue by Job.priority (higher first), else FCFS

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown capacity scheduler policy {self.policy!r}")


@dataclass
class Job:
    """One request: its input, limits and how it samples and stops. ``end_id`` ``None``
    or -1 disables the end-of-sequence check."""

    input_ids: list[int]
    max_tokens: int
    sampler: Sampler
    stop_words: list[list[int]] = field(default_factory=list)
    end_id: int | None = None
    priority: float = 0.5
    context: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    computed: int = 0
    reserved: int = 0
    started: bool = False

    def __post_init__(self) -> None:
        self.context = list(self.input_ids)


@dataclass(frozen=True)
class Event:
    """What one iteration produced for one request. ``tokens`` are this iteration's new
    output tokens, ``logprobs`` the log-probabilities of all output tokens so far.
    ``reason`` is a TensorRT-LLM ``FinishReason`` name; ``error`` ends the request."""

    job_id: int
    tokens: list[int]
    logprobs: list[float]
    final: bool
    reason: str
    error: str | None = None


@dataclass(frozen=True)
class KvPicture:
    """The KV cache after one iteration, in blocks."""

    max_blocks: int
    free_blocks: int
    used_blocks: int
    tokens_per_block: int


Sink = Callable[[list[Event], KvPicture], None]


class Batcher:
    """The worker. ``sink`` (a bound method of the batcher's owner) receives each
    iteration's events and KV picture on the worker thread; it must not call back into
    the batcher. The worker holds the owner only weakly, so a dropped owner can be
    collected; the owner stops the batcher when it is (``weakref.finalize``)."""

    def __init__(self, limits: Limits, sink: Sink) -> None:
        self.limits = limits
        self._sink = weakref.WeakMethod(sink)  # type: ignore[arg-type]
        self._cond = threading.Condition()
        self._queue: deque[tuple[int, Job]] = deque()
        self._cancelled: set[int] = set()
        self._active: list[tuple[int, Job]] = []
        self._stopping = False
        self._next_id = 1
        self._thread = threading.Thread(target=self._run, name="fake-trtllm", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> int:
        with self._cond:
            job_id, self._next_id = self._next_id, self._next_id + 1
            if self.limits.priority_queue:
                # PriorityWaitingQueue: higher priority first, arrival order among equals.
                at = next(
                    (i for i, (_, j) in enumerate(self._queue) if j.priority < job.priority),
                    len(self._queue),
                )
                self._queue.insert(at, (job_id, job))
            else:
                self._queue.append((job_id, job))
            self._cond.notify_all()
        return job_id

    def cancel(self, job_id: int) -> None:
        with self._cond:
            self._cancelled.add(job_id)
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread() and self._thread.is_alive():
            self._thread.join()

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._queue or self._active or self._cancelled):
                    self._cond.wait()
                if self._stopping:
                    return
                cancelled, self._cancelled = self._cancelled, set()
            out: list[Event] = []
            self._cancel(cancelled, out)
            self._admit(out)
            self._iterate(self._schedule(), out)
            sink = self._sink()
            if sink is None:  # the owner is gone
                return
            sink(out, self._picture())
            time.sleep(self.limits.iteration_s)

    def _cancel(self, ids: set[int], out: list[Event]) -> None:
        with self._cond:
            queued = [item for item in self._queue if item[0] in ids]
            for item in queued:
                self._queue.remove(item)
        gone = queued + [item for item in self._active if item[0] in ids]
        self._active = [item for item in self._active if item[0] not in ids]
        out.extend(Event(job_id, [], [], True, "CANCELLED") for job_id, _ in gone)

    def _admit(self, out: list[Event]) -> None:
        limits = self.limits
        while len(self._active) < limits.max_batch_size:
            with self._cond:
                if not self._queue:
                    return
                job_id, job = self._queue[0]
            error = self._invalid(job)
            if error is None and limits.policy != "MAX_UTILIZATION":
                need = self._blocks(len(job.input_ids) + job.max_tokens)
                if need > limits.kv_blocks:
                    error = f"Request needs {need} KV cache blocks; the cache holds "
                    error += f"{limits.kv_blocks}"
                elif limits.policy == "STATIC_BATCH" and self._active:
                    return  # a new batch starts only when this one is done
                elif need > limits.kv_blocks - sum(j.reserved for _, j in self._active):
                    return  # waits, in order, for blocks to free up
                job.reserved = need
            with self._cond:
                self._queue.popleft()
            if error is not None:
                out.append(Event(job_id, [], [], True, "NOT_FINISHED", error))
            else:
                self._active.append((job_id, job))

    def _invalid(self, job: Job) -> str | None:
        n, limits = len(job.input_ids), self.limits
        if n == 0:
            return "Input length must be at least 1"
        if n > limits.max_input_len:
            return f"Prompt length ({n}) exceeds maximum input length ({limits.max_input_len})."
        if job.max_tokens < 1:
            return f"max_tokens must be at least 1, got {job.max_tokens}"
        if n + job.max_tokens > limits.max_seq_len:
            return (
                f"Prompt length + number of requested output tokens ({n} + "
                f"{job.max_tokens}) exceeds maximum sequence length ({limits.max_seq_len})."
            )
        bad = [t for t in job.input_ids if not 0 <= t < limits.vocab_size]
        if bad:
            return f"Token id {bad[0]} is outside the vocabulary of {limits.vocab_size}"
        return None

    def _schedule(self) -> list[tuple[int, Job]]:
        """The requests that run this iteration."""
        if self.limits.policy != "MAX_UTILIZATION":
            return list(self._active)
        free = self.limits.kv_blocks
        scheduled: list[tuple[int, Job]] = []
        end = len(self._active)
        i = 0
        while i < end:
            job = self._active[i][1]
            need = self._blocks(len(job.context) + 1)
            if need <= free:
                free -= need
                scheduled.append(self._active[i])
                i += 1
                continue
            # Pause the most recently started request among those not yet scheduled.
            started = [k for k in range(i, end) if self._active[k][1].started]
            if not started:
                break
            victim = self._active[started[-1]][1]
            victim.computed = 0  # its KV is gone: recomputed when it runs again
            victim.started = False
            end = started[-1]
        return scheduled

    def _iterate(self, scheduled: list[tuple[int, Job]], out: list[Event]) -> None:
        budget = self.limits.max_num_tokens
        for job_id, job in scheduled:
            remaining = len(job.context) - job.computed
            if remaining > 0:
                if self.limits.chunked_context:
                    chunk = min(remaining, budget)
                else:
                    chunk = remaining if remaining <= budget else 0
                job.computed += chunk
                budget -= chunk
                job.started = job.started or chunk > 0
                if job.computed < len(job.context):
                    continue
            elif budget < 1:
                continue
            else:
                budget -= 1
            out.append(self._generate(job_id, job))

    def _generate(self, job_id: int, job: Job) -> Event:
        fail = self.limits.fail_token_id
        if job.output and fail is not None and fail in job.input_ids:
            self._finish(job_id)
            return Event(
                job_id,
                [],
                [],
                True,
                "NOT_FINISHED",
                f"Encountered an error in forward: token {fail}",
            )
        token, logprob = job.sampler.sample(next_token_logits(job.context, self.limits.vocab_size))
        new: list[int] = []
        reason = "NOT_FINISHED"
        if job.end_id is not None and job.end_id != -1 and token == job.end_id:
            reason = "END_ID"  # the end id is left out of the output
        else:
            job.context.append(token)
            job.output.append(token)
            job.logprobs.append(logprob)
            new = [token]
            if any(w and job.output[-len(w) :] == w for w in job.stop_words):
                reason = "STOP_WORDS"
            elif len(job.output) >= job.max_tokens:
                reason = "LENGTH"
        job.computed = len(job.context)
        final = reason != "NOT_FINISHED"
        if final:
            self._finish(job_id)
        return Event(job_id, new, list(job.logprobs), final, reason)

    def _finish(self, job_id: int) -> None:
        self._active = [item for item in self._active if item[0] != job_id]

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.limits.tokens_per_block)

    def _picture(self) -> KvPicture:
        used = sum(self._blocks(job.computed) for _, job in self._active)
        return KvPicture(
            self.limits.kv_blocks,
            self.limits.kv_blocks - used,
            used,
            self.limits.tokens_per_block,
        )
