"""A minimal stand-in for the scheduler: enough to drive any executor through prefill
chunks, decodes and preemption by recompute, with block ids taken from a given order."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from orchestrator.core.executor import Executor
from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import SamplingParams
from tests.factories import plan_entry


@dataclass
class Sequence:
    prompt: list[int]
    sampling: SamplingParams
    output: list[int] = field(default_factory=list)
    computed: int = 0
    blocks: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


def generate(
    executor: Executor,
    requests: dict[str, tuple[list[int], SamplingParams]],
    *,
    max_tokens: int,
    block_size: int,
    chunk: int,
    block_order: Iterable[int],
    preempt: dict[str, int] | None = None,
) -> dict[str, list[int]]:
    """Run every request to ``max_tokens`` output tokens, all in the same steps.

    Each step gives each request its next prompt chunk (at most ``chunk`` tokens) or its
    decode token. ``preempt`` maps a request id to the step at which its blocks are freed
    and its tokens recomputed from position 0, as the scheduler's recompute mode does.
    """
    free = list(block_order)
    seqs = {rid: Sequence(list(p), s) for rid, (p, s) in requests.items()}
    preempt = dict(preempt or {})
    step = 0
    while any(len(s.output) < max_tokens for s in seqs.values()):
        preempted = []
        for rid, at in list(preempt.items()):
            if at == step:
                free = seqs[rid].blocks + free
                seqs[rid].blocks, seqs[rid].computed = [], 0
                preempted.append(rid)
                del preempt[rid]
        scheduled = []
        for rid, s in seqs.items():
            if len(s.output) >= max_tokens:
                continue
            known = s.tokens
            n = min(chunk, len(known) - s.computed)
            end = s.computed + n
            while len(s.blocks) * block_size < end:
                s.blocks.append(free.pop(0))
            scheduled.append(
                plan_entry(
                    rid,
                    known[s.computed : end],
                    s.computed,
                    list(s.blocks),
                    end == len(known),
                    s.sampling,
                )
            )
        result = executor.execute(SchedulerOutput(scheduled, preempted_ids=preempted))
        for sr in scheduled:
            s = seqs[sr.request_id]
            s.computed += sr.num_tokens
            if sr.sample:
                s.output.append(result.sampled[sr.request_id])
        step += 1
    return {rid: s.output for rid, s in seqs.items()}
