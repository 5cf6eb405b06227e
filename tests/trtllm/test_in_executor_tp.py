"""The in-executor scheduler on two tensor-parallel ranks in two real worker processes
(tests/trtllm/fake_mpi.py): reached through the proxy's ``worker_main``, started by a
fake MPI pool session that pickles what it submits, with a real inter-process broadcast
between the ranks and the real socket channel to the serving process (this test).

One scenario runs once (module fixture, a few seconds) and each test checks one thing
of it: both ranks decided the same every iteration and produced the same tokens; facts
reached rank 0 (priority ordering); a refusal travelled back and the request was
aborted; a request whose facts came late waited, then ran with them; one without facts
was admitted with the defaults after the bound; after the channel was dropped the loop
carried on with the defaults."""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.core.config import EngineConfig
from plugins.trtllm.in_executor.channel import ChannelHost
from plugins.trtllm.in_executor.facts import RequestFacts
from plugins.trtllm.in_executor.workers import WorkerSetup, reach_workers
from plugins.trtllm.llm_api.settings import InExecutorCore
from tests.trtllm import fake_mpi
from tests.trtllm.in_executor_harness import seeded_workload

BLOCK = 16
NUM_BLOCKS = 40  # 640 tokens: a seeded job needs at most 22 blocks, REFUSED needs 45
WAIT_S = 1.0  # how long rank 0 holds a request without facts
WAIT_FOR_S = 60.0  # the longest the test waits for any one thing from the workers
TRIO = {1: 0, 2: 5, 3: 1}  # id: priority (ours, lower first), all submitted at once
LATE, NO_FACTS, REFUSED = 50, 60, 70
DROPPED = (80, 81)  # submitted after the channel was closed


@dataclass
class Scenario:
    ranks: dict[int, dict[str, Any]]
    heard: list[tuple[int, str]]
    jobs: dict[int, tuple[list[int], int]]  # id: (prompt, max tokens)
    facts_priority: dict[int, int]
    socket_dir: str
    socket_dir_removed: bool


def prompt(rid: int, n: int) -> list[int]:
    return [(7 * i + rid) % 997 + 1 for i in range(n)]


def core_config() -> InExecutorCore:
    engine = EngineConfig.model_validate(
        {
            "cache": {"block_size": BLOCK},
            "scheduler": {
                "policy": "priority",
                "max_batch_size": 2,
                "max_num_tokens": 128,
                "chunk_size": 64,
            },
            "executor": {"type": "sim", "model": "smollm2-135m", "hardware": "l40s"},
        }
    )
    return InExecutorCore(engine, 1 << 12, tensor_parallel_size=2)


def wait_for(what: str, done: Any, timeout_s: float = WAIT_FOR_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def scenario() -> Any:
    host = ChannelHost()
    heard: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
    host.refusals.listen(lambda rid, why: heard.put((rid, why)))
    setup = WorkerSetup(core_config(), BLOCK, host.address, WAIT_S, fake_mpi.import_fake)
    undo = reach_workers(setup, fake_mpi.import_fake)
    session = fake_mpi.FakeMpiPoolSession(2)
    requests, results, progress = (session.endpoint(n) for n in ("requests", "results", "done"))
    finished: set[int] = set()
    jobs: dict[int, tuple[list[int], int]] = {}
    facts_priority: dict[int, int] = {}

    def drain() -> set[int]:
        try:
            while True:
                finished.add(progress.get_nowait())
        except queue.Empty:
            return finished

    def submit(batch: list[tuple[int, list[int], int, int | None]], settle_s: float = 0.0) -> None:
        """As the backend does: generate_async (here a queue put), then the facts, after
        ``settle_s`` seconds (rank 0 holds the requests meanwhile: they are all in its
        view when their facts arrive, in one message)."""
        with host.submitting() as staged:
            for rid, tokens, max_tokens, _ in batch:
                jobs[rid] = (tokens, max_tokens)
                requests.put(("submit", rid, tokens, max_tokens))
            time.sleep(settle_s)
            for rid, _, _, priority in batch:
                if priority is not None:
                    staged[rid] = RequestFacts(priority=priority, tenant=f"t{rid}")
                    facts_priority[rid] = priority

    try:
        fake_mpi.PROXY.start_workers(
            session,
            requests="requests",
            results="results",
            progress="done",
            num_blocks=NUM_BLOCKS,
            block_size=BLOCK,
            max_iterations=20_000,
            deadline_s=WAIT_FOR_S,
        )
        assert host.wait_connected(WAIT_FOR_S), "rank 0 never connected"
        # Settled, so the priority order cannot depend on how many of the three rank 0's
        # first fetch took (it once took two, which then ran first as they came).
        submit([(rid, prompt(rid, 40), 24, p) for rid, p in TRIO.items()], settle_s=0.3)
        seeded = [
            (100 + j.request_id, list(j.prompt), j.max_tokens, j.priority)
            for j in seeded_workload(11, n=8)
        ]
        submit([*seeded, (REFUSED, prompt(REFUSED, 20), 700, 0)])
        submit([(LATE, prompt(LATE, 30), 6, None)])
        time.sleep(0.2)  # well under WAIT_S: the facts come late, not too late
        with host.submitting() as staged:
            staged[LATE] = RequestFacts(priority=-3, tenant="late")
        facts_priority[LATE] = -3
        submit([(NO_FACTS, prompt(NO_FACTS, 30), 6, None)])
        rid, why = heard.get(timeout=WAIT_FOR_S)
        requests.put(("cancel", rid))  # what RequestOutput.abort() asks of the executor
        everything = set(jobs)
        wait_for("the first requests to finish", lambda: drain() >= everything)
        socket_dir = host.directory
        host.close()  # the channel is dropped while the loop runs
        closed = not os.path.exists(socket_dir)
        time.sleep(0.3)  # rank 0 notices (its reader polls every 0.1 s)
        submit([(rid, prompt(rid, 20), 5, 0) for rid in DROPPED])  # facts dropped: closed
        requests.put(("stop",))
        ranks: dict[int, dict[str, Any]] = {}
        for _ in range(2):
            report = results.get(timeout=WAIT_FOR_S)
            ranks[report["rank"]] = report
        heard_all = [(rid, why)]
        while not heard.empty():
            heard_all.append(heard.get())
        yield Scenario(ranks, heard_all, jobs, facts_priority, socket_dir, closed)
    finally:
        session.shutdown()
        undo()
        host.close()


def first_scheduled(decisions: list[tuple[Any, ...]]) -> dict[int, int]:
    first: dict[int, int] = {}
    for i, (context, generation, _) in enumerate(decisions):
        for rid in [r for r, _ in context] + list(generation):
            first.setdefault(rid, i)
    return first


def test_both_ranks_decide_the_same_every_iteration_and_produce_the_same_tokens(
    scenario: Scenario,
) -> None:
    zero, one = scenario.ranks[0], scenario.ranks[1]
    assert not zero["timed_out"] and not one["timed_out"]
    assert zero["decisions"] and zero["decisions"] == one["decisions"]
    assert zero["finished"] == one["finished"]
    assert one["follower_core_requests"] == 0, "a follower runs no core of its own"
    assert zero["kv_free"] == one["kv_free"] == NUM_BLOCKS
    for rid, (tokens, max_tokens) in scenario.jobs.items():
        if rid == REFUSED:
            continue
        out, _, state = zero["finished"][rid]
        assert out[: len(tokens)] == tokens and len(out) == len(tokens) + max_tokens, rid
        assert state == "GENERATION_COMPLETE"
    chunks: dict[int, int] = {}
    for context, _, _ in zero["decisions"]:
        for rid, _ in context:
            chunks[rid] = chunks.get(rid, 0) + 1
    assert max(chunks.values()) > 1, "some prompt was prefilled in chunks"


def test_facts_reach_rank_zero_and_order_by_priority(scenario: Scenario) -> None:
    admitted = scenario.ranks[0]["admitted"]
    for rid, priority in scenario.facts_priority.items():
        assert admitted[rid]["priority"] == priority, rid
    assert admitted[1]["tenant"] == "t1"
    first = first_scheduled(scenario.ranks[0]["decisions"])
    # Two slots: priorities 0 and 1 go first; first-come-first-served would take 1 and 2.
    assert first[1] < first[2] and first[3] < first[2]


def test_a_refusal_travels_back_and_the_request_is_aborted_on_both_ranks(
    scenario: Scenario,
) -> None:
    assert [rid for rid, _ in scenario.heard] == [REFUSED]
    assert "needs 45 KV blocks; the KV pool holds 40" in scenario.heard[0][1]
    for rank in (0, 1):
        _, generated, state = scenario.ranks[rank]["finished"][REFUSED]
        assert generated == 0 and state == "GENERATION_COMPLETE"  # cancelled, never run
    assert REFUSED not in first_scheduled(scenario.ranks[0]["decisions"])
    assert not scenario.ranks[0]["refused"], "forgotten once TensorRT-LLM dropped it"


def test_a_request_whose_facts_come_late_waits_then_runs_with_them(scenario: Scenario) -> None:
    zero = scenario.ranks[0]
    admitted, (fetched_at, fetched_iteration) = zero["admitted"][LATE], zero["fetched"][LATE]
    assert admitted["priority"] == -3 and admitted["tenant"] == "late"
    assert admitted["iteration"] > fetched_iteration, "held at least one iteration"
    assert admitted["time"] - fetched_at < WAIT_S, "admitted on its facts, not the bound"
    assert LATE in first_scheduled(zero["decisions"]) and LATE in zero["finished"]


def test_a_request_without_facts_is_admitted_with_defaults_after_the_bound(
    scenario: Scenario,
) -> None:
    zero = scenario.ranks[0]
    admitted, (fetched_at, _) = zero["admitted"][NO_FACTS], zero["fetched"][NO_FACTS]
    assert admitted["priority"] == 0 and admitted["tenant"] is None
    assert admitted["time"] - fetched_at >= WAIT_S
    assert NO_FACTS in zero["finished"]


def test_a_dropped_channel_does_not_stop_the_loop(scenario: Scenario) -> None:
    zero = scenario.ranks[0]
    assert scenario.socket_dir_removed, "closing the channel removed its directory"
    assert zero["connected"] is False
    for rid in DROPPED:
        admitted, (fetched_at, _) = zero["admitted"][rid], zero["fetched"][rid]
        assert admitted["tenant"] is None, "its facts were dropped with the channel"
        assert admitted["time"] - fetched_at < WAIT_S, "nothing more awaited once closed"
        assert zero["finished"][rid] == scenario.ranks[1]["finished"][rid]
        assert len(zero["finished"][rid][0]) == 25
    assert zero["num_without_facts"] == 1 + len(DROPPED)
