"""Plans as the scheduler makes them, for driving the adapter step by step, and the
fake model's own greedy answers to compare with."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orchestrator.core.executor import Executor
from orchestrator.core.output import ScheduledRequest, SchedulerOutput, StepResult
from orchestrator.core.request import SamplingParams
from tests.factories import plan_entry
from tests.trtllm.fake_model import next_token_logits

GREEDY = SamplingParams(max_tokens=64, temperature=0)


@dataclass
class Seq:
    """One request's tokens and KV blocks, as the scheduler tracks them."""

    request_id: str
    prompt: list[int]
    blocks: list[int]
    block_size: int = 16
    sampling: SamplingParams = GREEDY
    output: list[int] = field(default_factory=list)
    computed: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def next(self, chunk: int | None = None) -> ScheduledRequest:
        """Its share of the next step: the next prompt chunk (all the rest if ``chunk``
        is ``None``) or its decode token."""
        known = self.tokens
        n = len(known) - self.computed
        end = self.computed + (n if chunk is None else min(chunk, n))
        table = self.blocks[: -(-end // self.block_size)]
        assert len(table) * self.block_size >= end, "give the Seq more blocks"
        return plan_entry(
            self.request_id,
            known[self.computed : end],
            self.computed,
            table,
            end == len(known),
            self.sampling,
        )

    def advance(self, scheduled: ScheduledRequest, result: StepResult) -> None:
        self.computed += len(scheduled.token_ids)
        if scheduled.sample:
            self.output.append(result.sampled[self.request_id])


def step(
    executor: Executor,
    seqs: Iterable[Seq],
    *,
    chunk: int | None = None,
    preempted: Sequence[str] = (),
    finished: Sequence[str] = (),
) -> StepResult:
    """Run one step of ``seqs`` (each its next chunk or decode) and advance them."""
    seqs = list(seqs)
    scheduled = [s.next(chunk) for s in seqs]
    plan = SchedulerOutput(scheduled, preempted_ids=list(preempted), finished_ids=list(finished))
    result = executor.execute(plan)
    for seq, s in zip(seqs, scheduled, strict=True):
        seq.advance(s, result)
    return result


def greedy_tokens(prompt: Sequence[int], n: int, vocab_size: int = 512) -> list[int]:
    """What the fake model greedily generates after ``prompt``."""
    context = list(prompt)
    for _ in range(n):
        logits = next_token_logits(context, vocab_size)
        context.append(max(range(vocab_size), key=logits.__getitem__))
    return context[len(prompt) :]


def greedy_logprob(context: Sequence[int], vocab_size: int = 512) -> float:
    """Log-probability of the fake model's greedy choice after ``context``."""
    logits = next_token_logits(context, vocab_size)
    top = max(logits)
    return -math.log(sum(math.exp(x - top) for x in logits))


def prompt_of(n: int, seed: int, vocab_size: int = 512) -> list[int]:
    return [(seed * 131 + 17 * i) % vocab_size for i in range(n)]
