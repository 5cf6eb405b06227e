"""Randomised end-to-end runs of EngineCore on the fake executor: hundreds of requests,
a KV pool small enough to force preemption, random priorities, arrivals and aborts; and
the SLO policies (deadline order, SLO admission, SLO budget, shedding, fair share), where
every request either completes with exactly its own tokens or is told why not."""

from __future__ import annotations

import random

import pytest

from orchestrator.core import OverloadedError
from orchestrator.core.request import RequestStatus
from tests.factories import make_engine, make_request, run_step
from tests.fakes import fake_token

CONFIGS = [
    {"policy": "fcfs", "chunk_size": 32},
    {"policy": "priority", "aging_rate": 5.0, "chunk_size": 64},
    {"policy": "priority", "aging_rate": 0.5, "chunk_size": 16, "max_preemptions": 2},
    {"policy": "fcfs", "batching": "prefill_first", "max_num_tokens": 400},
    {"policy": "fcfs", "batching": "static"},
]

SLO = {
    "slo_classes": {
        "interactive": {"ttft_ms": 300, "tpot_ms": 30},
        "batch": {"ttft_ms": 3000, "tpot_ms": 100},
    },
    "default_slo_class": "batch",
}
SLO_CONFIGS = [
    {**SLO, "policy": "slo", "chunk_size": 32},
    {
        **SLO,
        "policy": "slo",
        "chunk_size": 64,
        "admission": {"type": "slo", "shed_after_deadline_s": 0.5, "downgrade_to": "batch"},
        "slo_budget": {"enabled": True, "min_prefill_tokens": 8},
    },
    {
        **SLO,
        "policy": "priority",
        "chunk_size": 32,
        "admission": {"type": "slo", "ttft_margin": 2.0, "reserve_retries": True},
        "fair_share": {"enabled": True, "tenant_weights": {"t0": 3.0}},
    },
    {
        **SLO,
        "policy": "fcfs",
        "chunk_size": 16,
        "admission": {"shed_after_deadline_s": 0.0},
        "fair_share": {"enabled": True},
    },
]


def _name(config: dict) -> str:
    return "-".join(
        f"{k}={v}" if not isinstance(v, dict) else f"{k}={'+'.join(map(str, v.values()))}"
        for k, v in config.items()
        if k not in SLO
    )


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("config", SLO_CONFIGS, ids=_name)
def test_slo_policies_lose_nothing_and_keep_exact_tokens(seed: int, config: dict) -> None:
    rng = random.Random(100 + seed)
    num_blocks = 48
    engine, clock = make_engine(
        num_blocks=num_blocks,
        block_size=16,
        max_num_tokens=96,
        max_batch_size=12,
        max_waiting_requests=10_000,
        **config,
    )
    pending = []
    for i in range(300):
        prompt_len = rng.randint(1, 200)
        pending.append(
            make_request(
                prompt_len=prompt_len,
                max_tokens=rng.randint(1, min(160, 400 - prompt_len)),
                priority=rng.randint(0, 3),
                arrival_time=rng.uniform(0, 20.0),
                request_id=f"s{seed}-{i}",
                prompt=[rng.randrange(50) for _ in range(prompt_len)],
                slo_class=rng.choice(["interactive", "batch", None]),
                tenant=rng.choice(["t0", "t1", "t2", None]),
            )
        )
    pending.sort(key=lambda r: r.arrival_time, reverse=True)
    refused: set[str] = set()
    errors: dict[str, str] = {}
    aborted: set[str] = set()
    admitted = []
    for _ in range(50_000):
        while pending and pending[-1].arrival_time <= clock.now():
            request = pending.pop()
            try:
                engine.scheduler.add_request(request, clock.now())
            except OverloadedError as err:
                assert err.retry_after_s > 0 and err.code
                refused.add(request.request_id)
                continue
            admitted.append(request)
        if rng.random() < 0.01 and admitted:
            victim = rng.choice(admitted)
            if not victim.is_finished:
                engine.abort(victim.request_id)
                aborted.add(victim.request_id)
        if not engine.has_work():
            if not pending:
                break
            clock.advance_to(pending[-1].arrival_time)
            continue
        step = run_step(engine, clock)
        assert step.plan.num_tokens <= 96 and len(step.plan.scheduled) <= 12
        for out in step.outputs:
            if out.error is not None:
                assert out.finished and out.error_code == "ttft_deadline_passed"
                errors[out.request_id] = out.error
    else:
        pytest.fail("the engine did not drain in 50,000 steps")

    assert len(admitted) + len(refused) == 300
    for r in admitted:
        if r.request_id in aborted:
            assert r.status == RequestStatus.FINISHED_ABORTED
        elif r.request_id in errors:
            assert r.status == RequestStatus.FINISHED_ERROR and not r.output_token_ids
        else:
            n = r.num_prompt_tokens
            assert r.status == RequestStatus.FINISHED_LENGTH, r.request_id
            assert r.output_token_ids == [
                fake_token(r.request_id, n - 1 + k) for k in range(r.sampling.max_tokens)
            ], r.request_id
    kv = engine.scheduler.kv
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == num_blocks
    assert not engine.scheduler.requests and len(engine.scheduler.waiting) == 0
    admission = config.get("admission", {})
    # The load is meant to exercise what each config turns on.
    assert bool(refused) == (admission.get("type") == "slo")
    assert bool(errors) == (admission.get("shed_after_deadline_s") is not None)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())
)
def test_every_request_gets_exactly_its_own_tokens(seed: int, config: dict) -> None:
    rng = random.Random(seed)
    config = dict(config)
    budget = config.pop("max_num_tokens", 96)
    cap = 12
    num_blocks = 48  # 768 tokens for up to 12 requests of up to 360: preemption is certain
    engine, clock = make_engine(
        num_blocks=num_blocks,
        block_size=16,
        max_num_tokens=budget,
        max_batch_size=cap,
        max_waiting_requests=10_000,
        **config,
    )
    pending = []
    for i in range(300):
        prompt_len = rng.randint(1, 200)
        pending.append(
            make_request(
                prompt_len=prompt_len,
                max_tokens=rng.randint(1, min(160, 400 - prompt_len)),
                priority=rng.randint(0, 3),
                arrival_time=rng.uniform(0, 20.0),
                request_id=f"s{seed}-{i}",
                prompt=[rng.randrange(50) for _ in range(prompt_len)],
            )
        )
    pending.sort(key=lambda r: r.arrival_time, reverse=True)
    aborted, submitted = set(), []
    preemptions = 0
    for _ in range(50_000):
        while pending and pending[-1].arrival_time <= clock.now():
            request = pending.pop()
            engine.scheduler.add_request(request)
            submitted.append(request)
        if rng.random() < 0.01 and submitted:
            victim = rng.choice(submitted)
            if not victim.is_finished:
                engine.abort(victim.request_id)
                aborted.add(victim.request_id)
        if not engine.has_work():
            if not pending:
                break
            clock.advance_to(pending[-1].arrival_time)
            continue
        step = run_step(engine, clock)
        assert step.plan.num_tokens <= budget
        assert len(step.plan.scheduled) <= cap
        preemptions += len(step.plan.preempted_ids)
    else:
        pytest.fail("the engine did not drain in 50,000 steps")

    assert len(submitted) == 300 and aborted
    for r in submitted:
        if r.request_id in aborted:
            assert r.status == RequestStatus.FINISHED_ABORTED
            continue
        n = r.num_prompt_tokens
        assert r.status == RequestStatus.FINISHED_LENGTH, r.request_id
        assert r.output_token_ids == [
            fake_token(r.request_id, n - 1 + k) for k in range(r.sampling.max_tokens)
        ], r.request_id
    kv = engine.scheduler.kv
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == num_blocks
    if config.get("batching") != "static":
        assert preemptions > 0, "the pool was meant to force preemption"
    else:
        assert preemptions == 0, "static batches reserve their KV up front"
