"""KV events from the KV manager and the engine: stored blocks with their hashes, parent
and tokens; evictions; nothing recorded without a sink; a failing sink never stops the
engine; and replaying the events rebuilds the prefix cache exactly, after random
workloads (hypothesis)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EngineCore,
    KVEvent,
    SchedulerConfig,
    VirtualClock,
)
from orchestrator.core.kv.block_pool import BlockPool
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.request import Request
from orchestrator.core.sched.scheduler import Scheduler
from tests.factories import make_engine, make_request, run_step, run_to_completion
from tests.fakes import FakeExecutor

BS = 4


def compute(kv: KVCacheManager, r: Request, n: int) -> None:
    """Allocate and mark ``n`` more tokens computed, as the scheduler does."""
    assert kv.allocate(r, n) is not None
    r.num_computed_tokens += n
    kv.commit(r)


def replay(kv: KVCacheManager, events: Sequence[KVEvent], cached: set[BlockHash]) -> None:
    """Apply ``events`` to ``cached`` strictly: a stored hash is new and chains from its
    parent over its tokens, a removed hash was there."""
    hasher = kv.hasher
    for event in events:
        if isinstance(event, BlockStored):
            parent = event.parent_block_hash
            for i, h in enumerate(event.block_hashes):
                tokens = event.token_ids[i * event.block_size : (i + 1) * event.block_size]
                assert h == hasher.block_hash(hasher.root if parent is None else parent, tokens)
                assert h not in cached, "stored twice"
                cached.add(h)
                parent = h
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                assert h in cached, "removed a hash never stored"
                cached.remove(h)
        else:
            assert isinstance(event, AllBlocksCleared)
            cached.clear()


class Recorder:
    """A sink that keeps every batch it is handed."""

    def __init__(self) -> None:
        self.batches: list[list[KVEvent]] = []
        self.closed = 0

    def publish(self, events: Sequence[KVEvent]) -> None:
        self.batches.append(list(events))

    def close(self) -> None:
        self.closed += 1


def test_computed_full_blocks_are_stored_with_hashes_parent_and_tokens() -> None:
    kv = KVCacheManager(16, BS)
    kv.record_events()
    r = make_request(prompt_len=11)  # two full blocks and three tokens
    tokens = r.prompt_token_ids
    hashes = kv.hasher.prefix_hashes(tokens, BS)
    compute(kv, r, 6)  # block 0 becomes full
    assert kv.take_events() == [BlockStored((hashes[0],), None, tuple(tokens[:4]), BS)]
    compute(kv, r, 5)  # block 1 becomes full; block 2 is not
    assert kv.take_events() == [BlockStored((hashes[1],), hashes[0], tuple(tokens[4:8]), BS)]
    assert kv.take_events() == []

    whole = make_request(prompt=list(range(500, 513)))
    compute(kv, whole, 13)  # three blocks in one step: one event
    assert kv.take_events() == [
        BlockStored(
            tuple(kv.hasher.prefix_hashes(whole.prompt_token_ids, BS)),
            None,
            tuple(whole.prompt_token_ids[:12]),
            BS,
        )
    ]
    kv.integrity_check()


def test_a_block_another_request_holds_the_hash_of_is_not_stored_again() -> None:
    kv = KVCacheManager(16, BS)
    kv.record_events()
    prompt = list(range(100, 112))  # three full blocks
    a = make_request(prompt=[*prompt, 1])
    b = make_request(prompt=[*prompt[:4], 7, 7, 7, 7, *prompt[8:], 2])  # block 1 differs
    compute(kv, a, 13)
    kv.take_events()
    compute(kv, b, 13)
    hashes_b = kv.hasher.prefix_hashes(b.prompt_token_ids, BS)
    # b's block 0 has a's hash, which stays a's block's; blocks 1 and 2 chain from b's
    # own block 1, so both are new: one event, its parent the hash a stored.
    assert kv.take_events() == [
        BlockStored((hashes_b[1], hashes_b[2]), hashes_b[0], tuple(b.prompt_token_ids[4:12]), BS)
    ]


def test_evicting_cached_blocks_removes_exactly_their_hashes() -> None:
    kv = KVCacheManager(4, BS)
    kv.record_events()
    a = make_request(prompt_len=12)
    compute(kv, a, 12)
    stored = kv.hasher.prefix_hashes(a.prompt_token_ids, BS)
    kv.take_events()
    kv.free(a)  # tail first: block 2 is evicted first, then 1, then 0
    assert kv.take_events() == []  # freeing keeps the blocks cached
    b = make_request(prompt=[9] * 10)  # three blocks: the free one and two cached
    compute(kv, b, 10)
    events = kv.take_events()
    assert events[0] == BlockRemoved((stored[2], stored[1]))
    assert set(kv.pool.cached) == {stored[0], *kv.hasher.prefix_hashes([9] * 8, BS)}
    kv.integrity_check()


def test_without_a_sink_nothing_is_recorded_and_the_plain_paths_run() -> None:
    engine, clock = make_engine(num_blocks=8, block_size=BS)
    for i in range(6):
        engine.scheduler.add_request(make_request(prompt=[i] * 10, max_tokens=6), clock.now())
    run_to_completion(engine, clock)
    kv = engine.scheduler.kv
    assert kv.take_events() == []
    # The recording variants are chosen when a sink is attached, never tested per call.
    assert "allocate" not in vars(kv.pool) and "allocate_one" not in vars(kv.pool)
    assert "_cache_blocks" not in vars(kv)
    assert vars(kv.pool).get("_events") is None


def test_the_engine_publishes_once_per_step_after_the_update() -> None:
    engine, clock = make_engine(num_blocks=32, block_size=BS)
    sink = Recorder()
    engine.attach_kv_event_sink(sink)
    with pytest.raises(RuntimeError, match="already attached"):
        engine.attach_kv_event_sink(Recorder())
    r = make_request(prompt_len=9, max_tokens=4)
    engine.scheduler.add_request(r, clock.now())
    batches_per_step = []
    while engine.has_work():
        before = len(sink.batches)
        run_step(engine, clock)
        batches_per_step.append(len(sink.batches) - before)
    assert max(batches_per_step) == 1 and all(sink.batches)
    # 9 prompt tokens and 4 outputs: the 12 tokens computed fill three blocks.
    tokens = tuple(r.token_ids(0, 12))
    events = [e for batch in sink.batches for e in batch]
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert stored == events
    assert tuple(h for e in stored for h in e.block_hashes) == tuple(
        engine.scheduler.kv.hasher.prefix_hashes(tokens, BS)
    )
    engine.shutdown()
    assert sink.closed == 1


def test_a_raising_sink_never_stops_the_engine(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Recorder):
        def publish(self, events: Sequence[KVEvent]) -> None:
            raise OSError("socket gone")

    engine, clock = make_engine(num_blocks=16, block_size=BS)
    engine.attach_kv_event_sink(Broken())
    # Prompts of 3 to 10 tokens: their blocks fill on different steps.
    requests = [
        make_request(prompt=list(range(100 * i, 100 * i + 3 + i)), max_tokens=5) for i in range(8)
    ]
    for r in requests:
        engine.scheduler.add_request(r, clock.now())
    with caplog.at_level(logging.ERROR, logger="orchestrator.core.engine"):
        run_to_completion(engine, clock)
    assert all(r.is_finished and len(r.output_token_ids) == 5 for r in requests)
    assert engine.kv_event_sink_errors >= 3
    logged = [rec for rec in caplog.records if "KV event sink failed" in rec.getMessage()]
    # Logged at the 1st, 2nd, 4th... failure, not at every one.
    assert 1 <= len(logged) < engine.kv_event_sink_errors


def test_the_pool_records_evictions_in_order_only_when_asked() -> None:
    pool = BlockPool(3)
    events: list[KVEvent] = []
    for block, h in zip(pool.allocate(3), (b"a", b"b", b"c"), strict=True):
        assert pool.cache(block, h)
    pool.release([2, 0, 1])
    pool.allocate(1)
    pool.record_evictions(events)
    assert events == []
    pool.allocate(2)
    assert events == [BlockRemoved((b"a", b"b"))]


def test_one_block_at_a_time_evicts_and_records_as_allocate_does() -> None:
    pool = BlockPool(3)
    for block, h in zip(pool.allocate(3), (b"a", b"b", b"c"), strict=True):
        assert pool.cache(block, h)
    pool.release([2, 0, 1])  # free queue: 2, 0, 1
    assert pool.allocate_one() == 2  # evicts c, unrecorded
    events: list[KVEvent] = []
    pool.record_evictions(events)
    assert pool.allocate_one() == 0
    assert events == [BlockRemoved((b"a",))]
    assert set(pool.cached) == {b"b"} and pool.block_hashes[:3] == [None, b"b", None]
    assert pool.ref_counts == [1, 0, 1] and pool.num_used == 2 and pool.num_free == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_blocks=st.integers(8, 24),  # the longest request needs 7 blocks
    prompts=st.lists(
        st.tuples(
            st.integers(0, 3),  # shared prefix family
            st.integers(0, 12),  # own tokens after the family's 8
            st.integers(1, 6),  # output tokens
        ),
        min_size=1,
        max_size=12,
    ),
    scheme=st.sampled_from(["orchestrator", "vllm_sha256_cbor"]),
)
def test_replaying_the_events_rebuilds_the_cached_hashes(
    num_blocks: int, prompts: list[tuple[int, int, int]], scheme: str
) -> None:
    kv = KVCacheManager(num_blocks, BS, hash_scheme=scheme)
    scheduler = Scheduler(
        SchedulerConfig(max_num_tokens=16, max_batch_size=8, chunk_size=6), kv, 4096
    )
    clock = VirtualClock()
    engine = EngineCore(scheduler, FakeExecutor(num_blocks, BS), clock)
    sink = Recorder()
    engine.attach_kv_event_sink(sink)
    for i, (family, extra, max_tokens) in enumerate(prompts):
        prompt = [family * 10 + t for t in range(8)] + [100 + i] * extra
        r = make_request(prompt=prompt, max_tokens=max_tokens, arrival_time=0.0)
        engine.scheduler.add_request(r, clock.now())
    cached: set[BlockHash] = set()
    for _ in range(2_000):
        if not engine.has_work():
            break
        before = len(sink.batches)
        run_step(engine, clock)
        for batch in sink.batches[before:]:
            replay(kv, batch, cached)
        assert cached == set(kv.pool.cached)
    else:
        pytest.fail("the engine did not drain in 2,000 steps")
