"""The ``Executor`` invariants (orchestrator/executor.py), checked for every executor."""

from __future__ import annotations

import copy
import random

import pytest

from orchestrator.core.config import ConstraintsConfig
from orchestrator.core.constraint import ConstraintBackend, ConstraintKind, ConstraintSpec
from orchestrator.core.errors import AdmissionError
from orchestrator.core.executor import Executor
from orchestrator.core.output import SchedulerOutput
from orchestrator.core.request import Request, SamplingParams
from orchestrator.core.sched.constraints import ConstraintCompiles
from tests.contract.conftest import ExecutorCase
from tests.contract.driver import generate
from tests.factories import plan_entry

GREEDY = SamplingParams(temperature=0)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=1234)


def prompt(case: ExecutorCase, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(case.vocab_size) for _ in range(n)]


def blocks_for(case: ExecutorCase, tokens: int) -> int:
    return -(-tokens // case.block_size)


def test_kv_capacity_is_positive_and_constant(case: ExecutorCase, executor: Executor) -> None:
    capacity = executor.info().num_kv_blocks
    assert isinstance(capacity, int) and capacity > 0
    tokens = prompt(case, 5, 0)
    table = list(range(blocks_for(case, len(tokens))))
    executor.execute(SchedulerOutput([plan_entry("a", tokens, 0, table, True, GREEDY)]))
    assert executor.info().num_kv_blocks == capacity


def test_samples_exactly_the_requests_that_sample(case: ExecutorCase, executor: Executor) -> None:
    n = case.block_size + 3
    tables = [[2 * i, 2 * i + 1] for i in range(3)]
    plan = SchedulerOutput(
        [
            plan_entry(rid, prompt(case, n, i), 0, tables[i], sample, GREEDY)
            for i, (rid, sample) in enumerate([("a", True), ("b", False), ("c", True)])
        ]
    )
    result = executor.execute(plan)
    assert set(result.sampled) == {"a", "c"}
    assert all(isinstance(t, int) and 0 <= t < case.vocab_size for t in result.sampled.values())
    assert result.duration_s >= 0
    assert result.logprobs == {}


def test_execute_does_not_mutate_the_plan(case: ExecutorCase, executor: Executor) -> None:
    # "b" decodes at position 4 after a prefix computed in an earlier step.
    table_a = [9 + i for i in range(blocks_for(case, 7))]
    table_b = list(range(blocks_for(case, 5)))
    plan = SchedulerOutput(
        [
            plan_entry("a", prompt(case, 7, 1), 0, table_a, True, SEEDED),
            plan_entry("b", prompt(case, 1, 2), 4, table_b, True, GREEDY),
        ],
        preempted_ids=["x"],
        finished_ids=["y"],
    )
    before = copy.deepcopy(plan)
    executor.execute(plan)
    assert plan == before


def test_every_block_id_below_capacity_is_usable(case: ExecutorCase, executor: Executor) -> None:
    last = executor.info().num_kv_blocks - 1
    tokens = prompt(case, case.block_size + 1, 3)
    plan = SchedulerOutput([plan_entry("a", tokens, 0, [last, 0], True, GREEDY)])
    assert set(executor.execute(plan).sampled) == {"a"}


def test_a_plan_with_only_freed_ids_samples_nothing(case: ExecutorCase, executor: Executor) -> None:
    result = executor.execute(SchedulerOutput(preempted_ids=["a"], finished_ids=["b"]))
    assert result.sampled == {}


def test_logprobs_come_only_for_requests_that_ask(case: ExecutorCase, executor: Executor) -> None:
    asks = SamplingParams(temperature=0, logprobs=2)
    plan = SchedulerOutput(
        [
            plan_entry("a", prompt(case, 4, 4), 0, [0], True, asks),
            plan_entry("b", prompt(case, 4, 5), 0, [1], True, GREEDY),
        ]
    )
    result = executor.execute(plan)
    if not case.returns_logprobs:
        assert result.logprobs == {}
        return
    assert set(result.logprobs) == {"a"}
    lp = result.logprobs["a"]
    assert lp.logprob <= 0
    if not case.top_logprobs:
        assert lp.top == []
        return
    assert len(lp.top) == 2
    assert lp.top[0][0] == result.sampled["a"]  # greedy picks the most likely token


def test_tokens_do_not_depend_on_the_rest_of_the_batch(case: ExecutorCase) -> None:
    mine = {"greedy": (prompt(case, 21, 10), GREEDY), "seeded": (prompt(case, 13, 11), SEEDED)}
    others = {
        f"other-{i}": (prompt(case, 5 + 9 * i, 20 + i), SamplingParams(temperature=1.0))
        for i in range(3)
    }
    common = {"max_tokens": 6, "block_size": case.block_size}
    alone = generate(case.build(), mine, chunk=64, block_order=range(40), **common)
    crowded_executor = case.build()
    # Other requests in the batch, chunks of 7 and blocks from the top of the pool: the
    # batch, chunk boundaries and block ids of "greedy" and "seeded" all differ from
    # the run alone.
    crowded = generate(
        crowded_executor,
        {**others, **mine},
        chunk=7,
        block_order=reversed(range(crowded_executor.info().num_kv_blocks)),
        **common,
    )
    for rid in mine:
        assert crowded[rid] == alone[rid], rid


def test_tokens_survive_preemption_by_recompute(case: ExecutorCase) -> None:
    requests = {"greedy": (prompt(case, 17, 30), GREEDY), "seeded": (prompt(case, 9, 31), SEEDED)}
    common = {"max_tokens": 8, "block_size": case.block_size, "chunk": 8}
    plain = generate(case.build(), requests, block_order=range(40), **common)
    pattern = {"greedy": 5, "seeded": 6}
    preempted = generate(case.build(), requests, block_order=range(40), preempt=pattern, **common)
    if case.seeded_survives_preemption:
        assert preempted == plain
        return
    # Greedy survives; seeded repeats under the same preemptions and keeps the tokens it
    # had before step 6, after which a new random sequence starts.
    assert preempted["greedy"] == plain["greedy"]
    again = generate(case.build(), requests, block_order=range(40), preempt=pattern, **common)
    assert again == preempted
    assert preempted["seeded"][:5] == plain["seeded"][:5]


def test_shutdown_is_safe_twice(executor: Executor) -> None:
    executor.shutdown()
    executor.shutdown()


def test_constraints_are_enforced_where_claimed_and_refused_elsewhere(
    case: ExecutorCase, executor: Executor
) -> None:
    """An executor that claims constraint kinds compiles them and samples only what they
    allow; one that claims none has every constrained request refused (as the engine
    wires it: ``EngineCore.from_config``)."""
    kinds = executor.info().constraint_kinds
    backend = executor if kinds and isinstance(executor, ConstraintBackend) else None
    compiles = ConstraintCompiles(ConstraintsConfig(), backend, kinds)
    spec = ConstraintSpec(ConstraintKind.REGEX, "[0-9]{2,4}", "structured_outputs.regex")
    request = Request("c", prompt(case, 4, 3), GREEDY)
    request.constraint = spec
    if ConstraintKind.REGEX not in kinds:
        with pytest.raises(AdmissionError, match=r"structured_outputs\.regex: the executor cannot"):
            compiles.check(request)
        return
    assert backend is not None, "an executor with constraint kinds implements ConstraintBackend"
    compiles.check(request)
    handle = backend.compile_constraint(spec)
    tokens = prompt(case, 4, 3)
    table = list(range(blocks_for(case, len(tokens) + 4)))
    generated: list[int] = []
    for step in range(3):
        run = tokens + generated if step == 0 else generated[-1:]
        start = 0 if step == 0 else len(tokens) + len(generated) - 1
        entry = plan_entry("c", run, start, table, True, SEEDED, constraint=handle)
        result = executor.execute(SchedulerOutput([entry]))
        assert not result.failed, result.failed
        generated.append(result.sampled["c"])
    if case.decode is not None:  # digits, then only end-of-sequence once complete
        eos = set(executor.info().eos_token_ids)
        text = case.decode([t for t in generated if t not in eos])
        assert text.isdigit() and len(text) <= 4, (generated, text)
        first_eos = next((i for i, t in enumerate(generated) if t in eos), len(generated))
        assert all(t in eos for t in generated[first_eos:]), generated
