"""The shared executor contract (tests/contract) run against the trtllm adapter over the
fake bindings.

Two invariants of the suite do not hold for TensorRT-LLM's executor and are checked here
in the form that does (docs/trtllm.md says why):

- seeded sampling does not survive preemption: a re-enqueued request starts a new random
  sequence (greedy decoding does survive);
- log-probabilities come for the chosen token only, without top alternatives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.executor import Executor
from orchestrator.request import SamplingParams
from orchestrator.sched.output import ScheduledRequest, SchedulerOutput
from tests.contract import test_executor_contract as suite
from tests.contract.conftest import ExecutorCase
from tests.contract.driver import generate
from tests.trtllm.contract_case import trtllm_fake_case


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> ExecutorCase:
    return trtllm_fake_case(tmp_path_factory)


@pytest.fixture
def executor(case: ExecutorCase) -> Iterator[Executor]:
    executor = case.build()
    yield executor
    executor.shutdown()


test_kv_capacity_is_positive_and_constant = suite.test_kv_capacity_is_positive_and_constant
test_samples_exactly_the_requests_that_sample = suite.test_samples_exactly_the_requests_that_sample
test_execute_does_not_mutate_the_plan = suite.test_execute_does_not_mutate_the_plan
test_every_block_id_below_capacity_is_usable = suite.test_every_block_id_below_capacity_is_usable
test_a_plan_with_only_freed_ids_samples_nothing = (
    suite.test_a_plan_with_only_freed_ids_samples_nothing
)
test_tokens_do_not_depend_on_the_rest_of_the_batch = (
    suite.test_tokens_do_not_depend_on_the_rest_of_the_batch
)
test_shutdown_is_safe_twice = suite.test_shutdown_is_safe_twice


def test_greedy_tokens_survive_preemption_and_seeded_ones_repeat(case: ExecutorCase) -> None:
    requests = {
        "greedy": (suite.prompt(case, 17, 30), suite.GREEDY),
        "seeded": (suite.prompt(case, 9, 31), suite.SEEDED),
    }
    common: dict[str, Any] = {
        "max_tokens": 8,
        "block_size": case.block_size,
        "chunk": 8,
        "block_order": range(40),
    }
    plain = generate(case.build(), requests, **common)
    pattern = {"greedy": 5, "seeded": 6}
    preempted = generate(case.build(), requests, preempt=pattern, **common)
    assert preempted["greedy"] == plain["greedy"]
    # Seeded: the same preemptions give the same tokens; the tokens before the
    # preemption are the unpreempted ones, those after it come from a new random sequence.
    assert generate(case.build(), requests, preempt=pattern, **common) == preempted
    assert preempted["seeded"][:5] == plain["seeded"][:5]  # 5 tokens before step 6
    assert preempted["seeded"] != plain["seeded"]


def test_logprobs_are_the_chosen_tokens_only(case: ExecutorCase, executor: Executor) -> None:
    asks = SamplingParams(temperature=0, logprobs=2)
    plan = SchedulerOutput(
        [
            ScheduledRequest("a", suite.prompt(case, 4, 4), 0, [0], True, asks),
            ScheduledRequest("b", suite.prompt(case, 4, 5), 0, [1], True, suite.GREEDY),
        ]
    )
    result = executor.execute(plan)
    assert set(result.logprobs) == {"a"}
    assert result.logprobs["a"].logprob <= 0
    assert result.logprobs["a"].top == []
