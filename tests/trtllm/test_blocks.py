"""Token ids by KV block: any request's known tokens come back from its block table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugins.trtllm.blocks import BlockTokens


def test_tokens_come_back_through_a_scattered_block_table() -> None:
    store = BlockTokens(num_blocks=8, block_size=4)
    table = [6, 1, 3]
    store.write(table, 0, [10, 11, 12])
    store.write(table, 3, [13, 14, 15, 16, 17])  # crosses into blocks 1 and 3
    store.write(table, 8, [18])
    assert store.read(table, 9) == [10, 11, 12, 13, 14, 15, 16, 17, 18]
    assert store.read(table, 5) == [10, 11, 12, 13, 14]


def test_a_shared_prefix_is_read_through_another_table() -> None:
    store = BlockTokens(num_blocks=8, block_size=4)
    store.write([2, 5, 0], 0, list(range(100, 110)))
    assert store.read([2, 5, 7], 8) == list(range(100, 108))


def test_a_table_that_does_not_cover_the_positions_is_refused() -> None:
    store = BlockTokens(num_blocks=8, block_size=4)
    with pytest.raises(ValueError, match="does not cover position 8"):
        store.write([0, 1], 6, [1, 2, 3])
    with pytest.raises(ValueError, match="block id 8 is outside the pool of 8 blocks"):
        store.read([8], 1)


@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    order=st.permutations(list(range(12))),
)
def test_any_chunking_reads_back_what_was_written(lengths: list[int], order: list[int]) -> None:
    store = BlockTokens(num_blocks=12, block_size=5)
    tokens = [(7 * i + 3) % 1000 for i in range(sum(lengths))]
    table = order[: -(-len(tokens) // 5)]
    start = 0
    for n in lengths:
        store.write(table, start, tokens[start : start + n])
        start += n
    assert store.read(table, len(tokens)) == tokens
