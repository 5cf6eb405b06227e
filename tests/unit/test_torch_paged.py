"""Paged KV layout and attention against a dense reference on random tensors, through
the CPU kernels and through torch ops alone."""

from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from plugins.torch_executor.cpu_features import detect
from plugins.torch_executor.kernel_build import VARIANT_NAMES, variant_named
from plugins.torch_executor.model import RotaryTable, rotate
from plugins.torch_executor.native import Kernels, load_kernels
from plugins.torch_executor.paged import (
    PagedAttention,
    PagedKVCache,
    SequenceSlice,
    build_step,
    gather_context,
    slot_mapping,
)
from plugins.torch_executor.weights import ModelArgs

ARGS = ModelArgs(
    num_layers=1,
    hidden_size=48,
    num_heads=6,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=32,
    vocab_size=50,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    rope_scaling=None,
    max_position_embeddings=128,
    tie_word_embeddings=True,
    eos_token_ids=(),
)


def variant_kernels(name: str, folder: Path) -> Kernels:
    """The ``name`` variant's kernels; skips where this CPU cannot run or build them."""
    if not variant_named(name).runs_on(detect()):
        pytest.skip(f"this CPU cannot run the {name} kernels ({' '.join(detect().names())})")
    loaded = load_kernels(folder, variant=name)
    if loaded is None:
        pytest.skip("the CPU kernels cannot be built here (no C++ compiler)")
    if loaded.variant != name:
        pytest.skip(f"the {name} kernels do not build here (the compiler lacks its flags)")
    return loaded


@pytest.fixture(scope="module", params=VARIANT_NAMES)
def kernels(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Kernels:
    """The kernels of every variant this CPU runs, each in turn (the others skip)."""
    return variant_kernels(request.param, tmp_path_factory.mktemp("kernels"))


@pytest.fixture(scope="module", params=["torch", *VARIANT_NAMES])
def kernels_or_torch(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Kernels | None:
    """``None`` (torch ops), then each variant's kernels as ``kernels``."""
    if request.param == "torch":
        return None
    return variant_kernels(request.param, tmp_path_factory.mktemp("kernels"))


def test_slot_mapping_follows_block_tables() -> None:
    slices = [SequenceSlice(0, 3, 3, [5, 2]), SequenceSlice(3, 1, 0, [7])]
    assert slot_mapping(slices, block_size=4) == [23, 8, 9, 28]


def test_step_splits_kernel_rows_from_chunks() -> None:
    rope = RotaryTable(ARGS, 64, torch.float32)
    slices = [
        SequenceSlice(0, 1, 9, [0, 1, 2]),  # decode
        SequenceSlice(1, 20, 0, [3, 4, 5, 6, 7]),  # chunk from position 0
        SequenceSlice(21, 2, 4, [8, 9]),  # small chunk mid-sequence
    ]
    step = build_step(slices, 4, rope, scratch_block=99, kernel_max_rows=4)
    assert step.num_tokens == 23
    assert step.positions[:3].tolist() == [9, 0, 1]
    kr = step.kernel_rows
    assert kr is not None and kr.rows is not None
    assert kr.rows.tolist() == [0, 21, 22]
    assert kr.seqs.tolist() == [0, 1, 1]
    assert kr.lens.tolist() == [10, 5, 6]
    assert kr.tables.tolist() == [[0, 1, 2], [8, 9, 99]]  # padded with the scratch block
    assert [(c.first_row, c.num_rows, c.start_position) for c in step.chunks] == [(1, 20, 0)]
    assert torch.equal(step.cos[:, 0], rope.cos[step.positions])
    only_decodes = build_step(slices[:1], 4, rope, scratch_block=99, kernel_max_rows=1)
    assert only_decodes.kernel_rows is not None and only_decodes.kernel_rows.rows is None


def test_scratch_block_is_past_the_pool() -> None:
    cache = PagedKVCache(ARGS, 5, 4, torch.float32)
    assert cache.scratch_block == 5
    assert cache.k[0].shape == (2, 6, 16, 4) and cache.v[0].shape == (2, 6, 4, 16)


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


# head_dim 64 with 16-token blocks takes the kernel's vectorised path, the others its
# general one.
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("block", "head_dim"), [(4, 16), (16, 16), (16, 64)])
def test_paged_attention_equals_dense_attention(
    block: int, head_dim: int, cache_dtype: torch.dtype, kernels_or_torch: Kernels | None
) -> None:
    """Three steps over scattered blocks: prefixes (a long chunk from 0, short ones),
    then mid-sequence chunks long and short, then decodes; every row against dense
    causal attention over the request's whole sequence. With a bfloat16 or float16
    cache (the float32 model's narrower ones) the cache holds K and V rounded to it as
    torch rounds, and float32 queries attend over exactly those values."""
    kernels = kernels_or_torch
    args = dataclasses.replace(ARGS, head_dim=head_dim)
    torch.manual_seed(0)
    rng = random.Random(0)
    num_blocks = 48
    cache = PagedKVCache(args, num_blocks, block, cache_dtype)
    rope = RotaryTable(args, 128, torch.float32)
    lengths = {"a": 61, "b": 9, "c": 40, "d": 3}
    splits = [{"a": 30, "b": 5, "c": 2, "d": 1}, {"a": 60, "b": 8, "c": 39, "d": 2}]
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = {r: [free.pop() for _ in range(-(-n // block))] for r, n in lengths.items()}
    width = (args.num_heads + 2 * args.num_kv_heads) * args.head_dim
    qkv = {r: torch.randn(n, width) for r, n in lengths.items()}
    bounds = [{r: 0 for r in lengths}, *splits, lengths]
    nq, nkv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    for before, after in itertools.pairwise(bounds):
        spans = {r: (before[r], after[r]) for r in lengths}
        slices, row = [], 0
        for r, (a, b) in spans.items():
            slices.append(SequenceSlice(row, b - a, a, tables[r]))
            row += b - a
        max_rows = 1 if kernels is None else 16
        step = build_step(slices, block, rope, cache.scratch_block, max_rows)
        attention = PagedAttention(cache, step, args, rope, kernels)
        out = attention(0, torch.cat([qkv[r][a:b] for r, (a, b) in spans.items()]))
        for s, (r, (a, b)) in zip(slices, spans.items(), strict=True):
            full = qkv[r][:b]
            pos = torch.arange(b)
            cos, sin = rope.cos[pos].unsqueeze(1), rope.sin[pos].unsqueeze(1)
            q = rotate(full[:, :nq].view(b, args.num_heads, -1), cos, sin)
            k = rotate(full[:, nq : nq + nkv].view(b, args.num_kv_heads, -1), cos, sin)
            v = full[:, nq + nkv :].view(b, args.num_kv_heads, -1)
            keys, values = gather_context(cache.k[0], cache.v[0], torch.tensor(tables[r]), b)
            keys, values = keys.transpose(0, 1).float(), values.transpose(0, 1).float()
            # K as rotated here, rounded as the cache stores it (the kernel rotates in
            # float32 too, so a rounding may fall the other way: one step of the cache's
            # 16-bit type).
            step_size = {torch.float32: 1e-6, torch.bfloat16: 2**-8, torch.float16: 2**-10}[
                cache_dtype
            ]
            assert torch.allclose(keys, k.to(cache_dtype).float(), rtol=step_size, atol=1e-6)
            assert torch.equal(values, v.to(cache_dtype).float())
            expected = dense_reference(q[a:b], keys, values, a)
            got = out[s.first_row : s.first_row + s.num_rows]
            assert torch.allclose(got, expected, atol=1e-5), (r, a, b)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_few_rows_split_their_keys_across_threads_and_still_equal_dense_attention(
    kernels: Kernels, head_dim: int, threads: int
) -> None:
    """One or two decode rows have fewer (row, KV head) pairs than threads have work for,
    so the vectorised kernel (head_dim 64) splits each row's keys into ranges and merges
    the parts; lengths cover one key, a block's edges and many blocks."""
    args = dataclasses.replace(ARGS, head_dim=head_dim, num_heads=6, num_kv_heads=2)
    torch.manual_seed(3)
    rng = random.Random(3)
    cache = PagedKVCache(args, 64, 16, torch.float32)
    rope = RotaryTable(args, 300, torch.float32)
    width = (args.num_heads + 2 * args.num_kv_heads) * head_dim
    nq, nkv = args.num_heads * head_dim, args.num_kv_heads * head_dim
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for lengths in ([1], [16], [17], [100, 33], [257]):
            free = list(range(64))
            rng.shuffle(free)
            tables = [[free.pop() for _ in range(-(-n // 16))] for n in lengths]
            qkv = [torch.randn(n, width) for n in lengths]
            # Fill each context, then decode its last token.
            prefill = [SequenceSlice(0, n - 1, 0, t) for n, t in zip(lengths, tables, strict=True)]
            for sl, x in zip(prefill, qkv, strict=True):
                if sl.num_rows:
                    fill = build_step([sl], 16, rope, cache.scratch_block, 0)
                    PagedAttention(cache, fill, args, rope, kernels)(0, x[:-1])
            decodes = [
                SequenceSlice(i, 1, n - 1, t)
                for i, (n, t) in enumerate(zip(lengths, tables, strict=True))
            ]
            step = build_step(decodes, 16, rope, cache.scratch_block, 16)
            out = PagedAttention(cache, step, args, rope, kernels)(
                0, torch.cat([x[-1:] for x in qkv])
            )
            for i, (n, x) in enumerate(zip(lengths, qkv, strict=True)):
                pos = torch.arange(n)
                cos, sin = rope.cos[pos].unsqueeze(1), rope.sin[pos].unsqueeze(1)
                q = rotate(x[:, :nq].view(n, args.num_heads, -1), cos, sin)
                k = rotate(x[:, nq : nq + nkv].view(n, args.num_kv_heads, -1), cos, sin)
                v = x[:, nq + nkv :].view(n, args.num_kv_heads, -1)
                expected = dense_reference(q[-1:], k, v, n - 1)
                assert torch.allclose(out[i : i + 1], expected, atol=1e-5), (lengths, i)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("head_dim", [16, 64])
def test_bfloat16_kernel_attention_stays_close_to_float32(kernels: Kernels, head_dim: int) -> None:
    """The bfloat16 kernels (head_dim 64: the vectorised attention, 16: the general one)
    against float32 attention on the same bfloat16 inputs."""
    args = dataclasses.replace(ARGS, head_dim=head_dim)
    torch.manual_seed(2)
    cache = PagedKVCache(args, 16, 16, torch.bfloat16)
    rope = RotaryTable(args, 128, torch.bfloat16)
    width = (args.num_heads + 2 * args.num_kv_heads) * head_dim
    qkv = torch.randn(45, width).to(torch.bfloat16)
    table = [9, 3, 14]
    prefill = [SequenceSlice(0, 44, 0, table)]
    step = build_step(prefill, 16, rope, cache.scratch_block, kernel_max_rows=16)
    PagedAttention(cache, step, args, rope, kernels)(0, qkv[:44])
    decode = build_step([SequenceSlice(0, 1, 44, table)], 16, rope, cache.scratch_block, 16)
    out = PagedAttention(cache, decode, args, rope, kernels)(0, qkv[44:])
    keys, values = gather_context(cache.k[0], cache.v[0], torch.tensor(table), 45)
    q, _ = kernels.rope_store(
        qkv[44:], decode.positions, rope.cos, rope.sin, decode.slots, cache.k[0], cache.v[0],
        args.num_heads,
    )  # fmt: skip
    expected = dense_reference(
        q.float(), keys.transpose(0, 1).float(), values.transpose(0, 1).float(), 44
    )
    assert (out.float() - expected).abs().max().item() < 3e-2


def test_kernels_round_like_torch_in_bfloat16(kernels: Kernels) -> None:
    """RMSNorm and RoPE round where transformers' bfloat16 graph rounds: bit for bit."""
    torch.manual_seed(1)
    x = torch.randn(5, 48).to(torch.bfloat16)
    w = torch.randn(48).to(torch.bfloat16)
    xf = x.float()
    expected = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(kernels.rms_norm(x, w, 1e-6), expected)
    rope = RotaryTable(ARGS, 64, torch.bfloat16)
    cache = PagedKVCache(ARGS, 4, 4, torch.bfloat16)
    width = (ARGS.num_heads + 2 * ARGS.num_kv_heads) * ARGS.head_dim
    qkv = torch.randn(3, width).to(torch.bfloat16)
    positions, slots = torch.tensor([0, 7, 13]), torch.tensor([1, 6, 15])
    q, k = kernels.rope_store(
        qkv, positions, rope.cos, rope.sin, slots, cache.k[0], cache.v[0], ARGS.num_heads, True
    )
    nq, nkv = ARGS.num_heads * ARGS.head_dim, ARGS.num_kv_heads * ARGS.head_dim
    cos, sin = rope.cos[positions].unsqueeze(1), rope.sin[positions].unsqueeze(1)
    assert torch.equal(q, rotate(qkv[:, :nq].view(3, ARGS.num_heads, -1), cos, sin))
    assert k is not None
    assert torch.equal(k, rotate(qkv[:, nq : nq + nkv].view(3, ARGS.num_kv_heads, -1), cos, sin))


def test_rms_norm_writes_bfloat16_for_a_bfloat16_matmul_rounding_once(kernels: Kernels) -> None:
    """The float32 model's RMSNorm feeding a bfloat16 matmul: the float32 result, rounded
    once to bfloat16 as it is stored, bit for bit."""
    torch.manual_seed(3)
    x, w = torch.randn(37, 192), torch.randn(192)
    assert torch.equal(
        kernels.rms_norm(x, w, 1e-6, torch.bfloat16), kernels.rms_norm(x, w, 1e-6).bfloat16()
    )


def test_bytes_per_block_counts_k_and_v_of_every_layer() -> None:
    assert PagedKVCache.bytes_per_block(ARGS, 16, torch.bfloat16) == 2 * 1 * 2 * 16 * 16 * 2


def test_a_failed_kernel_build_falls_back_to_torch_ops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    assert load_kernels(tmp_path) is None
    assert not list((tmp_path / "torch_executor" / "kernels").glob("*.so"))


def test_a_sampling_chunk_sends_its_last_block_through_the_kernel() -> None:
    """The rows a later request with the same prompt recomputes on the prefix cache (from
    the start of the prompt's last block) attend through the kernel; the others, and
    chunks that do not sample, as SDPA chunks."""
    rope = RotaryTable(ARGS, 128, torch.float32)
    table = [4, 7, 1]
    cases = [
        (SequenceSlice(0, 37, 0, table, samples=True), 16, 32),  # tail: positions 32-36
        (SequenceSlice(0, 32, 0, table[:2], samples=True), 16, 16),  # aligned: last block
        (SequenceSlice(0, 21, 16, table, samples=True), 16, 16),  # from 16: 32-36 again
        (SequenceSlice(0, 37, 0, table, samples=False), 16, 37),  # a middle chunk
        (SequenceSlice(0, 37, 0, table, samples=True), 1, 37),  # no kernel for chunks
        (SequenceSlice(0, 5, 32, table, samples=True), 16, 0),  # short: all kernel
    ]
    for sl, max_rows, first in cases:
        assert sl.first_kernel_row(16, max_rows) == first, sl
        step = build_step([sl], 16, rope, 99, max_rows)
        chunk_rows = sum(c.num_rows for c in step.chunks)
        kernel = step.kernel_rows
        kernel_rows = 0 if kernel is None else len(kernel.lens)
        assert (chunk_rows, kernel_rows) == (first, sl.num_rows - first), sl
        if kernel is not None and first:
            tail = range(first, sl.num_rows)
            assert kernel.rows is not None and kernel.rows.tolist() == list(tail)
            assert kernel.lens.tolist() == [sl.start_position + i + 1 for i in tail]


@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "tile_chunks"),
    [(torch.float32, torch.float32, False), (torch.bfloat16, torch.bfloat16, False),
     (torch.float32, torch.bfloat16, False), (torch.bfloat16, torch.bfloat16, True),
     (torch.float32, torch.float16, False)],
)  # fmt: skip
def test_a_prompts_last_block_attends_the_same_on_the_prefix_cache(
    kernels: Kernels, dtype: torch.dtype, cache_dtype: torch.dtype, tile_chunks: bool
) -> None:
    """A 600-token prompt prefilled whole (its last chunk samples) and the same prompt's
    last block recomputed over its cached prefix, in a batch with other rows, on 1 and 2
    threads: the last block's attention is equal bit for bit, so the prefix cache cannot
    change the first token (head_dim 64: the vectorised kernel; 600 keys: two parts),
    also for float32 queries over a bfloat16 or float16 cache, and with the rest of the prompt
    attending on AMX tiles (``tile_chunks``)."""
    args = dataclasses.replace(ARGS, head_dim=64)
    if tile_chunks and not kernels.has_tile_attention(64, args.group_size, 16):
        pytest.skip(f"the {kernels.variant} kernels have no tile attention this process may use")
    torch.manual_seed(4)
    width = (args.num_heads + 2 * args.num_kv_heads) * args.head_dim
    qkv = torch.randn(600, width).to(dtype)
    other = torch.randn(3, width).to(dtype)
    table, other_table = list(range(38)), [40, 41, 42]
    rope = RotaryTable(args, 1024, dtype)
    previous = torch.get_num_threads()
    try:
        outs = []
        for threads, cached in [(1, False), (2, True), (1, True), (2, False)]:
            torch.set_num_threads(threads)
            cache = PagedKVCache(args, 48, 16, cache_dtype)
            if cached:  # the prefix as an earlier request left it; then the last block
                fill = build_step(
                    [SequenceSlice(0, 592, 0, table)], 16, rope, 48, 16, tile_chunks=tile_chunks
                )
                PagedAttention(cache, fill, args, rope, kernels)(0, qkv[:592])
                slices = [
                    SequenceSlice(0, 8, 592, table, samples=True),
                    SequenceSlice(8, 3, 40, other_table, samples=True),
                ]
                rows = torch.cat([qkv[592:], other])
            else:
                slices = [SequenceSlice(0, 600, 0, table, samples=True)]
                rows = qkv
            step = build_step(slices, 16, rope, 48, 16, tile_chunks=tile_chunks)
            assert (step.kernel_rows is not None and step.kernel_rows.runs is not None) == (
                tile_chunks and not cached
            )
            out = PagedAttention(cache, step, args, rope, kernels)(0, rows)
            outs.append(out[592:600] if not cached else out[:8])
        for out in outs[1:]:
            assert torch.equal(out, outs[0])
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (8, 1, 128)])
def test_prompt_chunks_on_tiles_attend_as_dense_attention_row_by_row(
    kernels: Kernels, heads: int, kv_heads: int, head_dim: int
) -> None:
    """Runs on AMX tiles (``Kernels.tile_attention``) over scattered blocks: prompts from
    position 0 and chunks mid-sequence, lengths off the 16-row tiles and the 64-key
    chunks, on 1 and 2 threads. Every row is float32 dense attention over the cache
    rounded to bfloat16 (its probabilities go in as two bfloat16 terms), and equal bit
    for bit whatever rows share its tile (the same rows in a run that starts 5 rows
    earlier), so a row's result depends on its own query and keys only."""
    group = heads // kv_heads
    if not kernels.has_tile_attention(head_dim, group, 16):
        pytest.skip(f"the {kernels.variant} kernels have no tile attention this process may use")
    args = dataclasses.replace(ARGS, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
    torch.manual_seed(5)
    rng = random.Random(5)
    num_blocks = 128
    cache = PagedKVCache(args, num_blocks, 16, torch.bfloat16)
    free = list(range(num_blocks))
    rng.shuffle(free)
    # (start position, rows): a prompt from 0, a chunk mid-sequence, one of 17 rows.
    shapes = [(0, 300), (200, 77), (48, 17)]
    tables = [[free.pop() for _ in range(-(-(a + n) // 16))] for a, n in shapes]
    ctx = [a + n for a, n in shapes]
    q = [torch.randn(n, heads, head_dim).bfloat16() for _, n in shapes]
    keys = [torch.randn(c, kv_heads, head_dim).bfloat16() for c in ctx]
    values = [torch.randn(c, kv_heads, head_dim).bfloat16() for c in ctx]
    for table, k, v in zip(tables, keys, values, strict=True):  # the caches as stored
        for pos in range(k.shape[0]):
            block, offset = table[pos // 16], pos % 16
            cache.k[0][:, block, :, offset] = k[pos]
            cache.v[0][:, block, offset] = v[pos]
    width = max(len(t) for t in tables)
    table_tensor = torch.tensor([t + [num_blocks] * (width - len(t)) for t in tables])
    rows = torch.cat(q)
    firsts = [sum(n for _, n in shapes[:i]) for i in range(len(shapes))]

    def attend(skip: int, threads: int) -> torch.Tensor:
        """Every run but for its first ``skip`` rows, on ``threads`` threads."""
        spans = enumerate(zip(firsts, shapes, strict=True))
        runs = torch.tensor([[f + skip, n - skip, i, a + skip] for i, (f, (a, n)) in spans])
        out = torch.zeros_like(rows)
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            kernels.tile_attention(
                rows, cache.k[0], cache.v[0], table_tensor, runs, out, head_dim**-0.5
            )
        finally:
            torch.set_num_threads(previous)
        return out

    whole, later = attend(0, 2), attend(5, 1)
    for i, ((a, n), f) in enumerate(zip(shapes, firsts, strict=True)):
        expected = dense_reference(q[i].float(), keys[i].float(), values[i].float(), a)
        got = whole[f : f + n].float()
        # Within the bfloat16 rounding of the result (half an ulp, 2^-8 relative at most)
        # and float32's sums: probabilities rounded to bfloat16 once were 40-150 times
        # further off, and changed the model's answers.
        assert torch.allclose(got, expected, atol=1e-5, rtol=2**-8 + 2**-16), (a, n)
        assert torch.equal(later[f + 5 : f + n], whole[f + 5 : f + n])
        assert not later[f : f + 5].any()  # rows outside the runs are left as they were
