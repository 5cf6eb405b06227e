"""The prefix-aware router: its prefix index, its three scores and their weights, and
the driver feeding it prompts and replica gauges."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.common.workloads import RequestSpec, Workload
from orchestrator.core import EngineCore, SchedulerConfig, VirtualClock
from orchestrator.core.kv.hashing import prefix_hashes, root_hash
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.sched.scheduler import Scheduler
from orchestrator.sim import cli, runner
from orchestrator.sim.config import ClusterConfig
from orchestrator.sim.driver import Replica, Simulation
from orchestrator.sim.router import (
    Load,
    PrefixAwareRouter,
    PrefixAwareWeights,
    PrefixIndex,
    RoundRobinRouter,
    Router,
    make_router,
)
from tests.fakes import FakeExecutor

BLOCK = 4  # tokens per router block in the unit tests


@dataclass
class FakeLoad:
    """A replica's gauges, set by the test."""

    outstanding_tokens: int = 0
    num_waiting: int = 0
    num_running: int = 0
    kv_usage: float = 0.0


def loads(n: int, **gauges: Any) -> list[FakeLoad]:
    return [FakeLoad(**gauges) for _ in range(n)]


def tenant_prompt(tenant: int, prefix_len: int, suffix: Sequence[int]) -> list[int]:
    """``prefix_len`` tokens shared by every prompt of ``tenant``, then ``suffix``."""
    return [1000 + tenant] * prefix_len + list(suffix)


def router(**kw: Any) -> PrefixAwareRouter:
    return PrefixAwareRouter(block_size=BLOCK, **kw)


# ---------------------------------------------------------------- the prefix index


def test_the_index_matches_the_longest_run_of_leading_blocks_per_replica() -> None:
    index = PrefixIndex(capacity=100)
    a, b, c, d = (bytes([i]) * 32 for i in range(4))
    index.add([a, b, c], replica=0)
    index.add([a, b], replica=1)
    index.add([d], replica=2)
    assert index.longest_prefixes([a, b, c, d]) == {0: 3, 1: 2}
    # A replica holding a later block but not the first matches nothing.
    assert index.longest_prefixes([d, a]) == {2: 1}
    assert index.longest_prefixes([b]) == {0: 1, 1: 1}


def test_the_index_forgets_least_recently_sent_blocks_beyond_its_cap() -> None:
    index = PrefixIndex(capacity=2)
    first, second = [b"x" * 32, b"y" * 32], [b"z" * 32]
    index.add(first, replica=0)
    index.add(second, replica=0)  # evicts the tail of `first`, the least recently used
    assert index.num_entries(0) == 2
    assert index.longest_prefixes(first) == {0: 1}
    assert index.longest_prefixes(second) == {0: 1}
    index.add(second, replica=1)
    index.add([b"w" * 32, b"v" * 32], replica=0)  # evicts all of replica 0's old blocks
    assert index.longest_prefixes(second) == {1: 1}
    assert index.longest_prefixes(first) == {}


def test_a_long_prompt_keeps_its_first_blocks_when_the_cap_cuts_it() -> None:
    index = PrefixIndex(capacity=2)
    hashes = [bytes([i]) * 32 for i in range(5)]
    index.add(hashes, replica=0)
    # The tail went first: a prefix is still usable, a tail without its head is not.
    assert index.longest_prefixes(hashes) == {0: 2}


def test_the_index_refuses_a_cap_below_one_block() -> None:
    with pytest.raises(ValueError, match="capacity"):
        PrefixIndex(capacity=0)


# ---------------------------------------------------------------- hashing


def test_blocks_are_hashed_with_the_seeded_sha256_chain() -> None:
    prompt = list(range(10))
    r = PrefixAwareRouter(block_size=BLOCK, seed="s1")
    assert r.block_hashes(prompt) == prefix_hashes(root_hash("s1"), prompt, BLOCK)
    assert len(r.block_hashes(prompt)) == 2  # two full blocks; the partial one is ignored
    assert r.block_hashes(prompt) != PrefixAwareRouter(block_size=BLOCK, seed="s2").block_hashes(
        prompt
    )


def test_only_the_first_max_prefix_blocks_are_hashed() -> None:
    r = router(max_prefix_blocks=2)
    a = tenant_prompt(0, 8, [1] * 8)
    b = tenant_prompt(0, 8, [2] * 8)
    assert len(r.block_hashes(a)) == 2
    assert r.block_hashes(a) == r.block_hashes(b)  # they differ only past the cap


# ---------------------------------------------------------------- scoring


def test_requests_sharing_a_prefix_follow_the_first_to_its_replica() -> None:
    r = router()
    replicas = loads(4)
    first = r.choose(replicas, tenant_prompt(0, 16, [1, 2, 3, 4]))
    replicas[first].outstanding_tokens = 100  # least outstanding would now avoid it
    for suffix in ([5, 6, 7, 8], [9, 9, 9, 9], [7]):
        assert r.choose(replicas, tenant_prompt(0, 16, suffix)) == first


def test_prefix_score_is_the_matched_share_of_the_prompt_blocks() -> None:
    r = router()
    replicas = loads(2)
    r.choose(replicas, tenant_prompt(0, 8, []))  # two blocks, to replica 0
    hashes = r.block_hashes(tenant_prompt(0, 8, [5, 5, 5, 5, 6, 6, 6, 6]))  # four blocks
    assert [s[0] for s in r.scores(replicas, hashes)] == [0.5, 0.0]


def test_a_new_prefix_goes_to_the_least_loaded_replica_on_a_tie() -> None:
    r = router()
    replicas = loads(3)
    replicas[0].outstanding_tokens = 50
    replicas[1].outstanding_tokens = 10
    replicas[2].outstanding_tokens = 30
    assert r.choose(replicas, tenant_prompt(7, 16, [])) == 1


def test_a_long_queue_outweighs_affinity() -> None:
    r = router(weights=PrefixAwareWeights(prefix=1.0, queue=2.0, kv=0.0))
    replicas = loads(2)
    home = r.choose(replicas, tenant_prompt(0, 16, []))
    replicas[home].num_waiting = 40
    other = 1 - home
    # prefix 1 x 1.0 + queue 0 x 2.0 = 1 at home, against 0 + 1 x 2.0 = 2 elsewhere.
    assert r.choose(replicas, tenant_prompt(0, 16, [3])) == other


def test_queue_scores_are_scaled_between_the_shortest_and_longest_queue() -> None:
    r = router()
    replicas = loads(3)
    for replica, q in zip(replicas, (0, 5, 10), strict=True):
        replica.num_waiting = q
    assert [s[1] for s in r.scores(replicas, [])] == [1.0, 0.5, 0.0]
    equal = loads(3, num_waiting=7)
    assert [s[1] for s in r.scores(equal, [])] == [1.0, 1.0, 1.0]


def test_kv_score_prefers_the_emptier_cache() -> None:
    r = router(weights=PrefixAwareWeights(prefix=0.0, queue=0.0, kv=1.0))
    replicas = loads(3)
    for replica, u in zip(replicas, (0.9, 0.2, 0.5), strict=True):
        replica.kv_usage = u
    assert [round(s[2], 6) for s in r.scores(replicas, [])] == [0.1, 0.8, 0.5]
    assert r.choose(replicas, tenant_prompt(0, 16, [])) == 1


def test_with_no_prefix_weight_affinity_is_ignored() -> None:
    r = router(weights=PrefixAwareWeights(prefix=0.0, queue=1.0, kv=1.0))
    replicas = loads(2)
    home = r.choose(replicas, tenant_prompt(0, 16, []))
    replicas[home].outstanding_tokens = 1  # the only difference left between them
    assert r.choose(replicas, tenant_prompt(0, 16, [1])) == 1 - home


def test_a_prompt_shorter_than_a_block_is_routed_but_not_indexed() -> None:
    r = router()
    replicas = loads(2)
    assert r.choose(replicas, [1, 2, 3]) == 0
    assert r.index.num_entries(0) == 0


def test_negative_weights_and_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="queue"):
        PrefixAwareWeights(queue=-1.0)
    with pytest.raises(ValueError, match="block_size"):
        PrefixAwareRouter(block_size=0)
    with pytest.raises(ValueError, match="max_prefix_blocks"):
        PrefixAwareRouter(max_prefix_blocks=0)


def test_the_registry_and_the_cluster_config_know_the_router() -> None:
    assert isinstance(make_router("prefix_aware"), PrefixAwareRouter)
    assert ClusterConfig(router="prefix_aware").router == "prefix_aware"


# ---------------------------------------------------------------- through the driver


class RecordingRouter:
    """Delegates to ``inner`` and keeps each decision with the prompt it was for."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner
        self.choices: list[tuple[tuple[int, ...], int]] = []

    def choose(self, replicas: Sequence[Load], prompt_token_ids: Sequence[int]) -> int:
        index = self.inner.choose(replicas, prompt_token_ids)
        self.choices.append((tuple(prompt_token_ids), index))
        return index


def fake_replicas(n: int, clock: VirtualClock, num_blocks: int = 512) -> list[Replica]:
    out = []
    for _ in range(n):
        kv = KVCacheManager(num_blocks, 16)
        scheduler = Scheduler(
            SchedulerConfig(chunk_size=64, max_num_tokens=64, max_batch_size=8), kv, 4096
        )
        out.append(Replica(EngineCore(scheduler, FakeExecutor(num_blocks, 16, 0.01), clock)))
    return out


TENANTS = 3


def shared_prefix_prompt(spec: RequestSpec) -> list[int]:
    """96 tokens shared by the tenant (``index % TENANTS``), then unique ones."""
    tenant = spec.index % TENANTS
    unique = [(spec.index * 7 + j) % 30_000 + 1 for j in range(spec.prompt_len - 96)]
    return [500 + tenant] * 96 + unique


def homes_of(inner: Router, n: int = 40) -> dict[int, set[int]]:
    """The replicas each tenant's requests went to, on four fake replicas."""
    clock = VirtualClock()
    replicas = fake_replicas(4, clock)
    workload = Workload([RequestSpec(i, 0.05 * i, 128, 4) for i in range(n)])
    rec = RecordingRouter(inner)
    run = Simulation(replicas, clock, workload, rec, prompts=shared_prefix_prompt).run()
    assert all(r.ok for r in run.records)
    assert len(rec.choices) == n
    homes: dict[int, set[int]] = {}
    for prompt, index in rec.choices:
        assert len(prompt) == 128
        homes.setdefault(prompt[0] - 500, set()).add(index)
    return homes


def test_the_driver_hands_the_router_each_prompt_and_a_tenant_keeps_its_replica() -> None:
    homes = homes_of(PrefixAwareRouter(block_size=16))
    assert len(homes) == TENANTS
    assert all(len(h) == 1 for h in homes.values()), homes


def test_round_robin_scatters_each_tenant_over_every_replica() -> None:
    homes = homes_of(RoundRobinRouter())
    assert all(h == {0, 1, 2, 3} for h in homes.values()), homes


def test_replicas_expose_their_engines_gauges_to_the_router() -> None:
    clock = VirtualClock()
    (replica,) = fake_replicas(1, clock, num_blocks=100)
    assert (replica.num_waiting, replica.num_running, replica.kv_usage) == (0, 0, 0.0)
    seen: list[tuple[int, int, float]] = []

    class Spy:
        def choose(self, replicas: Sequence[Load], prompt_token_ids: Sequence[int]) -> int:
            r = replicas[0]
            seen.append((r.num_waiting, r.num_running, r.kv_usage))
            return 0

    # Three requests at t=0: each arrival sees those queued before it.
    workload = Workload([RequestSpec(i, 0.0, 160, 2) for i in range(3)])
    Simulation([replica], clock, workload, Spy()).run()
    assert [s[0] for s in seen] == [0, 1, 2]
    stats = replica.core.stats()
    assert replica.kv_usage == stats.kv_blocks_used / stats.kv_blocks_total


def test_a_prompt_factory_of_the_wrong_length_is_refused() -> None:
    clock = VirtualClock()
    workload = Workload([RequestSpec(0, 0.0, 32, 2)])
    sim = Simulation(fake_replicas(1, clock), clock, workload, RoundRobinRouter(), lambda s: [1])
    with pytest.raises(ValueError, match="has 1 tokens"):
        sim.run()


# ---------------------------------------------------------------- orchestrator plan


def test_plan_sizes_the_cluster_behind_the_router_it_is_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    used: list[str] = []
    real = runner.make_router

    def spy(name: str) -> Router:
        used.append(name)
        return real(name)

    monkeypatch.setattr(runner, "make_router", spy)
    parser = argparse.ArgumentParser(prog="orchestrator")
    cli.register(parser.add_subparsers(dest="command", required=True))
    argv = ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--tp", "1"]
    argv += ["--rate", "1", "--slo-ttft-ms", "800", "--num-requests", "30"]
    args = parser.parse_args([*argv, "--output-len", "16", "--router", "prefix_aware"])
    assert args.func(args) == 0
    assert used and set(used) == {"prefix_aware"}
    assert "fewest GPUs:" in capsys.readouterr().out
