"""KV block manager: focused cases and a hypothesis state machine over random
allocate / compute / append / preempt / free sequences with shared prefixes."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from orchestrator.core.kv.block_pool import BlockPool
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.request import Request
from tests.factories import make_request

BS = 4


def compute(kv: KVCacheManager, r: Request, n: int, prefix: list[int] | None = None) -> bool:
    """Allocate and mark ``n`` tokens computed, as the scheduler does; False if no room."""
    if kv.allocate(r, n, prefix) is None:
        return False
    if prefix:
        r.num_computed_tokens = len(prefix) * kv.block_size
    r.num_computed_tokens += n
    kv.commit(r)
    return True


def test_mirroring_an_executor_allocates_the_whole_prompt_on_the_first_chunk() -> None:
    kv = KVCacheManager(10, BS, False, mirror_executor=True)
    r = make_request(prompt_len=14)  # 4 blocks, the first chunk 5 tokens
    assert len(kv.allocate(r, 5) or []) == 4
    r.num_computed_tokens = 5
    assert len(kv.allocate(r, 5) or []) == 4  # covered already: nothing new
    r.output_token_ids.extend([1, 2])
    r.num_computed_tokens = 15
    assert len(kv.allocate(r, 1) or []) == 4  # position 15 is in block 3
    r.num_computed_tokens = 16
    assert len(kv.allocate(r, 1) or []) == 5  # a decode's block, one at a time
    plain = KVCacheManager(10, BS, False)
    assert len(plain.allocate(make_request(prompt_len=14), 5) or []) == 2
    kv.integrity_check()


def test_mirroring_an_executor_allocates_nothing_beyond_its_free_count() -> None:
    kv = KVCacheManager(10, BS, False, mirror_executor=True)
    kv.observe_executor_free(7)  # the executor still holds 3 blocks we freed
    assert kv.allocate(make_request(prompt_len=32), 4) is None  # 8 blocks > 7
    assert kv.allocate(make_request(prompt_len=28), 4) is not None  # 7 blocks
    plain = KVCacheManager(10, BS, False)
    plain.observe_executor_free(7)
    assert plain.allocate(make_request(prompt_len=32), 32) is not None  # admission only
    kv.integrity_check()


def test_allocate_hands_out_a_table_that_later_allocations_leave_alone() -> None:
    kv = KVCacheManager(8, BS)
    r = make_request(prompt_len=6)
    table = kv.allocate(r, 6)
    assert isinstance(table, tuple) and len(table) == 2
    r.num_computed_tokens = 6
    r.output_token_ids.extend([1, 2, 3])
    grown = kv.allocate(r, 3)  # positions 6..8: a third block
    assert grown is not None and len(grown) == 3 and grown[:2] == table and len(table) == 2
    assert kv.allocate(r, 0) is grown  # unchanged table: the same tuple, built once
    kv.integrity_check()


def test_decodes_register_each_filled_block_and_a_full_pool_refuses_the_next() -> None:
    kv = KVCacheManager(3, BS)
    r = make_request(prompt=[10, 11, 12, 13, 14, 15])
    assert compute(kv, r, 6)
    for token in (16, 17, 18, 19, 20, 21):  # decodes: each computes the last known token
        r.output_token_ids.append(token)
        assert compute(kv, r, 1)
    # 12 tokens computed (three blocks, every one registered); the 13th needs a fourth.
    assert r.num_computed_tokens == 12 and kv.num_free_blocks == 0
    before = (kv.block_tables(), kv.pool.num_used)
    assert kv.allocate(r, 1) is None
    assert (kv.block_tables(), kv.pool.num_used) == before
    # While it still runs, a prompt that starts with its 12 tokens finds all three blocks,
    # the two filled by decodes included.
    reader = make_request(prompt=[*range(10, 22), 99])
    assert kv.find_cached_prefix(reader) == kv.block_table(r.request_id)
    kv.integrity_check()


def test_allocate_covers_positions_and_free_returns_blocks() -> None:
    kv = KVCacheManager(8, BS)
    r = make_request(prompt_len=10)
    assert compute(kv, r, 10)
    assert len(kv.block_table(r.request_id)) == 3  # 10 tokens in blocks of 4
    assert kv.num_used_blocks == 3
    kv.free(r)
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == 8
    kv.integrity_check()


def test_allocate_answers_none_and_changes_nothing_when_full() -> None:
    kv = KVCacheManager(3, BS)
    a, b = make_request(prompt_len=8), make_request(prompt_len=8)
    assert compute(kv, a, 8)
    before = (kv.num_free_blocks, kv.block_tables())
    assert kv.allocate(b, 8) is None
    assert (kv.num_free_blocks, kv.block_tables()) == before
    kv.integrity_check()


def test_prefix_blocks_are_reused_and_last_token_is_left_to_compute() -> None:
    kv = KVCacheManager(16, BS)
    shared = list(range(100, 112))  # three full blocks
    a = make_request(prompt=[*shared, 1, 2])
    assert compute(kv, a, a.num_tokens)
    kv.free(a)  # blocks stay cached
    b = make_request(prompt=[*shared, 7])
    hits = kv.find_cached_prefix(b)
    assert len(hits) == 3
    assert compute(kv, b, b.num_tokens - 12, hits)
    assert kv.block_table(b.request_id)[:3] == hits
    # A prompt that is exactly the cached blocks still leaves its last block to compute.
    c = make_request(prompt=list(shared))
    assert len(kv.find_cached_prefix(c)) == 2
    kv.integrity_check()


def test_freed_tail_blocks_are_evicted_before_the_prefix() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    for i, b in enumerate(blocks):
        pool.cache(b, 1000 + i)
    pool.release(reversed(blocks))
    # The never-used block goes first, then the request's tail, its prefix last.
    assert pool.allocate(2) == [3, blocks[2]]
    assert pool.lookup(1000) == blocks[0] and pool.lookup(1002) is None


def test_prefix_caching_off_never_reuses() -> None:
    kv = KVCacheManager(8, BS, enable_prefix_caching=False)
    a = make_request(prompt=list(range(9)))
    assert compute(kv, a, 9)
    kv.free(a)
    assert kv.find_cached_prefix(make_request(prompt=list(range(9)))) == []
    assert not kv.pool.cached


def test_integrity_check_catches_a_leak() -> None:
    kv = KVCacheManager(4, BS)
    r = make_request(prompt_len=4)
    assert compute(kv, r, 4)
    kv._records.pop(r.request_id)  # drop ownership without releasing
    with pytest.raises(AssertionError, match="reference counts"):
        kv.integrity_check()


# A small alphabet and a few shared stems make prefix hits frequent.
STEMS = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 5, 5]]


class KVStateMachine(RuleBasedStateMachine):
    """Random lifecycles against a shadow model of what each block holds."""

    requests = Bundle("requests")

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(12, BS)
        self.live: dict[str, Request] = {}
        self.content: dict[int, dict[int, int]] = {}  # block -> offset -> token
        self.count = 0

    @rule(
        target=requests,
        stem=st.sampled_from(STEMS),
        tail=st.lists(st.integers(0, 3), min_size=1, max_size=10),
    )
    def add(self, stem: list[int], tail: list[int]) -> Request:
        self.count += 1
        r = Request(f"r{self.count}", [*stem, *tail])
        self.live[r.request_id] = r
        return r

    def _record(self, r: Request, start: int, stop: int) -> None:
        table = self.kv.block_table(r.request_id)
        for pos in range(start, stop):
            token = r.token_ids(pos, pos + 1)[0]
            self.content.setdefault(table[pos // BS], {})[pos % BS] = token

    @rule(r=requests, n=st.integers(1, 12))
    def step(self, r: Request, n: int) -> None:
        if r.request_id not in self.live or r.num_uncomputed_tokens == 0:
            return
        n = min(n, r.num_uncomputed_tokens)
        prefix = None
        if not self.kv.block_table(r.request_id):
            prefix = self.kv.find_cached_prefix(r)
            for i, block in enumerate(prefix):
                # A reused block must hold exactly this request's tokens.
                expected = r.token_ids(i * BS, (i + 1) * BS)
                assert [self.content[block][o] for o in range(BS)] == expected
            n = min(n, r.num_tokens - len(prefix) * BS)
        start = len(prefix) * BS if prefix else r.num_computed_tokens
        if compute(self.kv, r, n, prefix):
            self._record(r, start, start + n)

    @rule(r=requests, token=st.integers(0, 3))
    def append_output(self, r: Request, token: int) -> None:
        if r.request_id in self.live and r.num_uncomputed_tokens == 0:
            r.output_token_ids.append(token)

    @rule(r=requests)
    def preempt(self, r: Request) -> None:
        if r.request_id in self.live:
            self.kv.free(r, keep_hashes=True)
            r.num_computed_tokens = 0

    @rule(r=consumes(requests))
    def finish(self, r: Request) -> None:
        if self.live.pop(r.request_id, None) is not None:
            self.kv.free(r)

    @invariant()
    def blocks_accounted_for(self) -> None:
        self.kv.integrity_check()
        owned = {b for blocks in self.kv.block_tables().values() for b in blocks}
        assert self.kv.num_used_blocks == len(owned)

    def teardown(self) -> None:
        for r in self.live.values():
            self.kv.free(r)
        self.kv.integrity_check()
        assert self.kv.num_free_blocks == self.kv.num_blocks, "blocks leaked"


TestKVStateMachine = KVStateMachine.TestCase
TestKVStateMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
