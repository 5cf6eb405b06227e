"""Our scheduler's plans as TensorRT-LLM submissions, cancels and streamed tokens.

Both modes run plans the same way; only the ``Backend`` differs (the C++ ``Executor`` in
engine mode, ``LLM.generate_async`` in LLM-API mode). TensorRT-LLM batches in flight,
chunks contexts and owns the KV cache; our scheduler owns admission, priority order and
preemption over a KV pool the size of TensorRT-LLM's (measured at start). Per plan:

- ids in ``preempted_ids`` and ``finished_ids`` are cancelled in TensorRT-LLM (unless it
  already finished them) and their buffered tokens dropped;
- each scheduled chunk's tokens are recorded by KV block (``BlockTokens``); prefill chunks
  without ``sample`` need nothing else: TensorRT-LLM takes a prompt whole;
- a request that samples and is not running in TensorRT-LLM (first sampling step, or the
  first after a preemption) is submitted with all its known tokens, rebuilt from its
  block table, asking for the tokens it may still produce;
- a request that samples gets the next token its stream buffered, waiting for the
  backend if none has come yet.

Step durations are wall time. Requests TensorRT-LLM fails (or refuses) are named in
``StepResult.failed`` with its message, after their state is dropped; the engine ends
them with an error and the others carry on.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from orchestrator.core import (
    SamplingParams,
    ScheduledRequest,
    SchedulerOutput,
    StepResult,
    TokenLogprobs,
)
from plugins.trtllm.blocks import BlockTokens
from plugins.trtllm.errors import TrtllmError, TrtllmStalledError
from plugins.trtllm.streams import Streams, Update

_UINT64 = (1 << 64) - 1


class Ask(NamedTuple):
    """One streaming request for TensorRT-LLM: ``max_tokens`` more tokens after
    ``tokens``, sampled as ``sampling`` says with ``seed``. ``priority`` is ours (lower
    first, the plan's ``ScheduledRequest.priority``); a mode or release that cannot pass
    it on leaves TensorRT-LLM's own queue first-come-first-served. ``slo_class``,
    ``tenant`` and ``arrival_time`` (seconds, engine clock) are the plan's too, for a
    mode that schedules inside TensorRT-LLM (LLM-API in-executor mode). ``constraint`` is
    the plan's handle (``ScheduledRequest.constraint``; the mode's guide), ``None`` for
    none."""

    tokens: Sequence[int]
    max_tokens: int
    sampling: SamplingParams
    seed: int | None
    priority: int = 0
    slo_class: str | None = None
    tenant: str | None = None
    arrival_time: float = 0.0
    constraint: object | None = None


class Backend(Protocol):
    """What a mode provides to run plans. Only the thread that calls ``execute`` calls
    these."""

    def submit(self, ask: Ask) -> int:
        """Send ``ask``; returns its submission id. Raises when TensorRT-LLM refuses it
        at once."""
        ...

    def cancel(self, submission: int) -> None:
        """Stop a submission; its final update may still come."""
        ...

    def poll(self, timeout_s: float) -> list[Update]:
        """Every update that has arrived, waiting up to ``timeout_s`` seconds for the
        first; empty on timeout."""
        ...


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


class PlanRunner:
    """Runs plans over a ``Backend``. ``blocks`` records tokens by the KV block that holds
    them, over the pool the plans' block tables index; ``max_seq_len`` (tokens) caps what a
    request may ask for (``None``: no cap of TensorRT-LLM's own). ``seed`` seeds the
    seeds drawn for sampled requests that carry none (TensorRT-LLM's default seed is the
    same for every request, so identical prompts would sample identical text).
    Not thread-safe: one thread calls ``execute``."""

    def __init__(
        self,
        backend: Backend,
        blocks: BlockTokens,
        *,
        max_seq_len: int | None,
        seed: int | None,
        step_timeout_s: float,
    ) -> None:
        self._backend = backend
        self._max_seq_len = max_seq_len
        self._step_timeout_s = step_timeout_s
        self._rng = random.Random(seed)
        self._blocks = blocks
        self._streams = Streams()
        self._prompt_lens: dict[str, int] = {}  # kept across preemptions, dropped at finish

    def execute(self, plan: SchedulerOutput) -> StepResult:
        start = time.perf_counter()
        # Route what has arrived first, so that a request TensorRT-LLM has already ended
        # (it runs ahead of our steps) is not cancelled needlessly.
        self._route(self._backend.poll(0.0))
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
                error = self._submit(scheduled)
                if error is not None:
                    refused[request_id] = error
                    continue
            if scheduled.sample:
                sampling.append(request_id)
        self._wait_until_ready(sampling, start + self._step_timeout_s)
        return self._take(sampling, start, refused)

    # ------------------------------------------------------------------ steps

    def _release(self, request_id: str) -> None:
        stream = self._streams.drop(request_id)
        if stream is not None and not stream.final:
            self._backend.cancel(stream.submission)

    def _check_decode(self, scheduled: ScheduledRequest) -> None:
        """A request running in TensorRT-LLM only ever decodes the token it was last
        given: anything else means the plan and TensorRT-LLM's state have parted."""
        stream = self._streams.get(scheduled.request_id)
        if scheduled.sample and tuple(scheduled.token_ids) == (stream.last_token,):
            return
        raise TrtllmError(
            f"request {scheduled.request_id!r} runs in TensorRT-LLM after token "
            f"{stream.last_token}, but the plan gives it {list(scheduled.token_ids)} at position "
            f"{scheduled.start_position} (sample={scheduled.sample})"
        )

    def _submit(self, scheduled: ScheduledRequest) -> str | None:
        """Send a request with all its known tokens; returns why it could not be sent."""
        request_id, sampling = scheduled.request_id, scheduled.sampling
        length = scheduled.context_len
        tokens = self._blocks.read(scheduled.block_table, scheduled.start_position)
        tokens += scheduled.token_ids
        # The first submission sees the prompt alone; a resumed request's tokens also
        # hold what it generated before its preemption.
        generated = length - self._prompt_lens.setdefault(request_id, length)
        max_tokens = sampling.max_tokens - generated
        if self._max_seq_len is not None:
            max_tokens = min(max_tokens, self._max_seq_len - length)
        if max_tokens < 1:
            return (
                f"{length} tokens, {generated} of them generated, leave no room for another "
                f"(max_tokens={sampling.max_tokens}, max_seq_len={self._max_seq_len})"
            )
        if scheduled.constraint is not None and generated:
            # TensorRT-LLM starts a guide at the end of what it is given: resumed, the
            # grammar would restart mid-output and let through what it must not.
            return (
                "constraint: a constrained request cannot resume after preemption on "
                f"TensorRT-LLM ({generated} tokens generated; its guide would restart)"
            )
        try:
            seed = self._seed(sampling, generated)
            ask = Ask(
                tokens,
                max_tokens,
                sampling,
                seed,
                scheduled.priority,
                scheduled.slo_class,
                scheduled.tenant,
                scheduled.arrival_time,
                scheduled.constraint,
            )
            submission = self._backend.submit(ask)
        except Exception as err:  # TensorRT-LLM's refusal of this one request
            return f"TensorRT-LLM refused the request: {type(err).__name__}: {err}"
        self._streams.add(request_id, submission, sampling.logprobs is not None)
        return None

    def _seed(self, sampling: SamplingParams, generated: int) -> int | None:
        if sampling.greedy:
            return None
        if sampling.seed is None:
            return self._rng.getrandbits(64)
        return resume_seed(sampling.seed, generated)

    def _route(self, updates: list[Update]) -> None:
        for update in updates:
            self._streams.route(update)

    def _wait_until_ready(self, request_ids: list[str], deadline: float) -> None:
        waiting = [rid for rid in request_ids if not self._streams.get(rid).ready]
        while waiting:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TrtllmStalledError(
                    f"TensorRT-LLM produced no token within {self._step_timeout_s} s for "
                    f"request(s) {', '.join(map(repr, waiting))}"
                )
            self._route(self._backend.poll(remaining))
            waiting = [rid for rid in waiting if not self._streams.get(rid).ready]

    def _take(self, request_ids: list[str], start: float, refused: dict[str, str]) -> StepResult:
        """One buffered token per request; the requests ``refused`` at submission and
        those whose stream ended without a token go into ``failed`` with TensorRT-LLM's
        message (their state is dropped: TensorRT-LLM already finished them)."""
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
            token, logprob = self._streams.get(rid).take()
            sampled[rid] = token
            if logprob is not None:
                # Both modes return the chosen token's log-probability only.
                logprobs[rid] = TokenLogprobs(logprob, [])
        return StepResult(sampled, time.perf_counter() - start, logprobs, failed=errors)
