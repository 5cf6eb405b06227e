"""Paged KV layout and attention against a dense reference on random tensors."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from plugins.torch_executor.paged import (
    PagedAttention,
    PagedKVCache,
    SequenceSlice,
    build_group,
    plan_groups,
    slot_mapping,
)
from plugins.torch_executor.weights import ModelArgs

ARGS = ModelArgs(
    num_layers=1,
    hidden_size=48,
    num_heads=6,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=32,
    vocab_size=50,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    rope_scaling=None,
    max_position_embeddings=128,
    tie_word_embeddings=True,
    eos_token_ids=(),
)


def test_slot_mapping_follows_block_tables() -> None:
    slices = [SequenceSlice(0, 3, 3, [5, 2]), SequenceSlice(3, 1, 0, [7])]
    assert slot_mapping(slices, block_size=4).tolist() == [23, 8, 9, 28]


def test_mask_is_causal_from_the_chunk_start_and_hides_padding() -> None:
    # Two chunks of two rows: one at positions 5..6 (2 blocks), one at 0..1 (1 block).
    group = build_group(
        [SequenceSlice(0, 2, 5, [3, 1]), SequenceSlice(2, 2, 0, [4])], block_size=4, group_size=1
    )
    allowed = group.allowed[0]  # [batch, queries, keys]
    assert allowed.shape == (2, 2, 8)
    assert allowed[0, 0].tolist() == [True] * 6 + [False] * 2
    assert allowed[0, 1].tolist() == [True] * 7 + [False]
    assert allowed[1, 0].tolist() == [True] + [False] * 7
    assert group.block_ids.tolist() == [3, 1, 4, 0]
    assert group.rows.tolist() == [[0, 1], [2, 3]]


def test_mask_repeats_per_query_head_in_a_gqa_group() -> None:
    group = build_group([SequenceSlice(0, 2, 0, [0])], block_size=4, group_size=3)
    allowed = group.allowed[0, 0]  # [queries * group, keys]
    assert [row.sum().item() for row in allowed] == [1, 1, 1, 2, 2, 2]


def test_groups_split_by_row_count() -> None:
    slices = [
        SequenceSlice(0, 1, 9, [0, 1, 2]),
        SequenceSlice(1, 4, 0, [3]),
        SequenceSlice(5, 1, 2, [4]),
        SequenceSlice(6, 4, 4, [5, 6]),
    ]
    groups = plan_groups(slices, block_size=4, group_size=3)
    assert sorted(g.rows.shape for g in groups) == [(2, 1), (2, 4)]
    with pytest.raises(ValueError, match="equal row counts"):
        build_group(slices[:2], block_size=4, group_size=3)


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Causal attention of queries at positions ``start ..`` over keys ``0 ..``.
    q: [n, heads, d]; k, v: [ctx, kv_heads, d]."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # [heads, ctx, d]
    v = v.repeat_interleave(rep, dim=1).transpose(0, 1)
    q_pos = torch.arange(start, start + q.shape[0])
    mask = torch.arange(k.shape[1])[None, :] <= q_pos[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask)
    return out.transpose(0, 1)  # [n, heads, d]


def test_chunked_paged_attention_equals_dense_attention() -> None:
    torch.manual_seed(0)
    rng = random.Random(0)
    block, num_blocks = 4, 32
    cache = PagedKVCache(ARGS, num_blocks, block, torch.float32)
    lengths = {"a": 19, "b": 6, "c": 11}
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = {r: [free.pop() for _ in range(-(-n // block))] for r, n in lengths.items()}
    q = {r: torch.randn(n, ARGS.num_heads, ARGS.head_dim) for r, n in lengths.items()}
    k = {r: torch.randn(n, ARGS.num_kv_heads, ARGS.head_dim) for r, n in lengths.items()}
    v = {r: torch.randn(n, ARGS.num_kv_heads, ARGS.head_dim) for r, n in lengths.items()}
    # Two steps: prefixes first, then the rest (a mid-sequence chunk and decodes).
    splits = {"a": 7, "b": 5, "c": 10}
    for step in (0, 1):
        spans = {r: (0, splits[r]) if step == 0 else (splits[r], n) for r, n in lengths.items()}
        slices, row = [], 0
        for r, (a, b) in spans.items():
            slices.append(SequenceSlice(row, b - a, a, tables[r]))
            row += b - a
        attention = PagedAttention(
            cache, slot_mapping(slices, block), plan_groups(slices, block, ARGS.group_size), ARGS
        )
        out = attention(
            0,
            torch.cat([q[r][a:b] for r, (a, b) in spans.items()]),
            torch.cat([k[r][a:b] for r, (a, b) in spans.items()]),
            torch.cat([v[r][a:b] for r, (a, b) in spans.items()]),
        )
        for s, (r, (a, b)) in zip(slices, spans.items(), strict=True):
            expected = dense_reference(q[r][a:b], k[r][:b], v[r][:b], a)
            got = out[s.first_row : s.first_row + s.num_rows]
            assert torch.allclose(got, expected, atol=1e-5), (step, r)


def test_bytes_per_block_counts_k_and_v_of_every_layer() -> None:
    assert PagedKVCache.bytes_per_block(ARGS, 16, torch.bfloat16) == 2 * 1 * 2 * 8 * 16 * 2
