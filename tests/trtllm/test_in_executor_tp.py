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
from plugins.trtllm.in_executor.settings import InExecutorCore
from plugins.trtllm.in_executor.workers import WorkerSetup, reach_workers
from tests.trtllm import fake_mpi
from tests.trtllm.in_executor_harness import seeded_workload

BLOCK = 16
NUM_BLOCKS = 40  # 640 tokens: a seeded job needs at most 22 blocks, REFUSED needs 45
WAIT_S = 2.0  # how long rank 0 holds a request without facts
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


class Progress:
    """Rank 0's progress reports (``fake_mpi.worker_main``), collected as they come;
    ``wait(what, done)`` blocks on the queue (bounded by ``WAIT_FOR_S``) until
    ``done(self)`` holds."""

    def __init__(self, reports: Any) -> None:
        self._reports = reports
        self.events: dict[str, set[int]] = {"finished": set(), "held": set(), "disconnected": set()}

    def wait(self, what: str, done: Any) -> None:
        deadline = time.monotonic() + WAIT_FOR_S
        while not done(self):
            left = deadline - time.monotonic()
            try:
                kind, rid = self._reports.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise AssertionError(f"timed out waiting for {what}") from None
            self.events[kind].add(rid)


@pytest.fixture(scope="module")
def scenario() -> Any:
    host = ChannelHost()
    heard: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
    host.refusals.listen(lambda rid, why: heard.put((rid, why)))
    setup = WorkerSetup(core_config(), BLOCK, host.address, WAIT_S, fake_mpi.import_fake)
    undo = reach_workers(setup, fake_mpi.import_fake)
    session = fake_mpi.FakeMpiPoolSession(2)
    requests, results = session.endpoint("requests"), session.endpoint("results")
    progress = Progress(session.endpoint("done"))
    jobs: dict[int, tuple[list[int], int]] = {}
    facts_priority: dict[int, int] = {}

    def send(batch: list[tuple[int, list[int], int]]) -> None:
        """As the backend's generate_async (here a queue put)."""
        for rid, tokens, max_tokens in batch:
            jobs[rid] = (tokens, max_tokens)
            requests.put(("submit", rid, tokens, max_tokens))

    def facts(priorities: dict[int, int]) -> None:
        """As the backend does after generate_async: the facts, over the channel."""
        with host.submitting() as staged:
            for rid, priority in priorities.items():
                staged[rid] = RequestFacts(priority=priority, tenant=f"t{rid}")
                facts_priority[rid] = priority

    def held(*rids: int) -> Any:
        return lambda p: set(rids) <= p.events["held"]

    try:
        fake_mpi.PROXY.start_workers(
            session,
            requests="requests",
            results="results",
            progress="done",
            num_blocks=NUM_BLOCKS,
            block_size=BLOCK,
            max_iterations=200_000,
            deadline_s=WAIT_FOR_S,
        )
        assert host.wait_connected(WAIT_FOR_S), "rank 0 never connected"
        # Facts sent once rank 0 holds all three, so they are admitted together and the
        # priority order cannot depend on how many of them one fetch took.
        send([(rid, prompt(rid, 40), 24) for rid in TRIO])
        progress.wait("the trio to be held", held(*TRIO))
        facts(TRIO)
        seeded = {100 + j.request_id: j for j in seeded_workload(11, n=8)}
        with host.submitting() as staged:  # as the backend: the requests, then their facts
            send([(rid, list(j.prompt), j.max_tokens) for rid, j in seeded.items()])
            send([(REFUSED, prompt(REFUSED, 20), 700)])
            priorities = {rid: j.priority for rid, j in seeded.items()} | {REFUSED: 0}
            for rid, priority in priorities.items():
                staged[rid] = RequestFacts(priority=priority, tenant=f"t{rid}")
            facts_priority.update(priorities)
        send([(LATE, prompt(LATE, 30), 6)])
        progress.wait("the late request to be held", held(LATE))
        with host.submitting() as staged:
            staged[LATE] = RequestFacts(priority=-3, tenant="late")
        facts_priority[LATE] = -3
        send([(NO_FACTS, prompt(NO_FACTS, 30), 6)])
        rid, why = heard.get(timeout=WAIT_FOR_S)
        requests.put(("cancel", rid))  # what RequestOutput.abort() asks of the executor
        # The refused request ends at the next iteration that runs a batch after its
        # cancel (the fake's _executor_loop, as TensorRT-LLM's): the dropped-channel
        # requests below are that batch, so it is not awaited here.
        others = set(jobs) - {REFUSED}
        progress.wait("the first requests to finish", lambda p: others <= p.events["finished"])
        socket_dir = host.directory
        host.close()  # the channel is dropped while the loop runs
        closed = not os.path.exists(socket_dir)
        progress.wait("rank 0 to see the channel closed", lambda p: p.events["disconnected"])
        send([(rid, prompt(rid, 20), 5) for rid in DROPPED])  # no facts: the channel is closed
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
    admitted, (_, fetched_iteration) = zero["admitted"][LATE], zero["fetched"][LATE]
    assert admitted["priority"] == -3 and admitted["tenant"] == "late"
    assert admitted["iteration"] > fetched_iteration, "held at least one iteration"
    # Its priority proves it was admitted on its facts, before the bound (the defaults
    # would have given 0).
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
        admitted, (_, fetched_iteration) = zero["admitted"][rid], zero["fetched"][rid]
        assert admitted["tenant"] is None, "its facts were dropped with the channel"
        assert admitted["iteration"] == fetched_iteration, "nothing more awaited once closed"
        assert zero["finished"][rid] == scenario.ranks[1]["finished"][rid]
        assert len(zero["finished"][rid][0]) == 25
    assert zero["num_without_facts"] == 1 + len(DROPPED)
