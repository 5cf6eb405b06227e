"""Batching strategies alone: what each puts in a step, on the fake executor."""

from __future__ import annotations

import pytest

from orchestrator.core.config import SchedulerConfig
from orchestrator.core.sched.batching import (
    BATCHING_STRATEGIES,
    ContinuousBatching,
    PrefillFirstBatching,
    StaticBatching,
)
from tests.factories import make_engine, make_request, run_step


def test_config_names_pick_registered_strategies_and_unknown_ones_are_refused() -> None:
    expected = {
        "continuous": ContinuousBatching,
        "prefill_first": PrefillFirstBatching,
        "static": StaticBatching,
    }
    assert expected == BATCHING_STRATEGIES
    with pytest.raises(
        ValueError, match=r"batching\n  Input should be 'continuous', 'prefill_first' or 'static'"
    ):
        SchedulerConfig(batching="orca")


def test_continuous_mixes_a_decode_and_a_prefill_chunk_in_one_step() -> None:
    engine, clock = make_engine(batching="continuous", chunk_size=32, max_num_tokens=64)
    engine.scheduler.add_request(make_request(prompt_len=8, max_tokens=20, request_id="d"))
    run_step(engine, clock)  # "d" prefilled; it decodes from now on
    engine.scheduler.add_request(make_request(prompt_len=100, max_tokens=2, request_id="p"))
    step = run_step(engine, clock)
    sizes = {s.request_id: s.num_tokens for s in step.plan.scheduled}
    assert sizes == {"d": 1, "p": 32}


def test_prefill_first_runs_waiting_prompts_whole_while_decodes_wait() -> None:
    engine, clock = make_engine(batching="prefill_first", max_num_tokens=256)
    engine.scheduler.add_request(make_request(prompt_len=8, max_tokens=20, request_id="d"))
    run_step(engine, clock)
    engine.scheduler.add_request(make_request(prompt_len=100, max_tokens=2, request_id="p"))
    step = run_step(engine, clock)
    assert [(s.request_id, s.num_tokens) for s in step.plan.scheduled] == [("p", 100)]
    assert not PrefillFirstBatching.chunks_prefill


def test_static_takes_no_new_request_until_the_batch_is_done() -> None:
    engine, clock = make_engine(batching="static", max_batch_size=4)
    engine.scheduler.add_request(make_request(prompt_len=8, max_tokens=3, request_id="a"))
    run_step(engine, clock)
    engine.scheduler.add_request(make_request(prompt_len=8, max_tokens=3, request_id="b"))
    seen = []
    while engine.has_work():
        seen.append({s.request_id for s in run_step(engine, clock).plan.scheduled})
    first_b = next(i for i, ids in enumerate(seen) if "b" in ids)
    assert all("a" not in ids for ids in seen[first_b:]), "b joined while a still ran"
