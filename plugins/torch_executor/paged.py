"""The paged KV cache, the per-step batch layout, and attention that reads each
request's context through its block table.

Layout per layer: K ``[kv_heads, num_blocks, head_dim, block_size]`` (each block stored
transposed, so a block's scores accumulate lane-wise in the CPU kernel) and V
``[kv_heads, num_blocks, block_size, head_dim]``. One block past the pool (id
``num_blocks``) is scratch: padded rows of a captured CUDA graph write there, and no
request ever owns it.

``StepBatch`` is everything about the plan that attention needs, built once per step
(never per layer): slots, positions, block tables, which rows attend through the paged
kernel and which prefill chunks go through SDPA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from plugins.torch_executor.buckets import pad_dim, padded_context, padded_rows
from plugins.torch_executor.model import RotaryTable, rotate
from plugins.torch_executor.native import Kernels
from plugins.torch_executor.weights import ModelArgs

# Chunks of at most this many rows attend row by row through the paged kernel, which
# reads the cache in place, where the executor has not measured a bound of its own
# (attention_bound.py, which also keeps at least this many). Measured on one SmolLM2
# layer, bfloat16, one thread, a chunk after 256 cached tokens: 16 rows 150 us (kernel)
# vs 178 us (SDPA), 32 rows 298 vs 218 us.
KERNEL_MAX_ROWS = 16


class PagedKVCache:
    """Preallocated K and V blocks for every layer, plus one scratch block.

    Zero-filled on purpose: attention may read whole blocks and discard the slots past a
    request's length, and those slots must hold finite numbers (uninitialised memory may
    be NaN, and NaN times a zero weight is still NaN).
    """

    def __init__(
        self,
        args: ModelArgs,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"a KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        physical = num_blocks + 1  # the last one is scratch
        k_shape = (args.num_kv_heads, physical, args.head_dim, block_size)
        v_shape = (args.num_kv_heads, physical, block_size, args.head_dim)
        self.k = [torch.zeros(k_shape, dtype=dtype, device=device) for _ in range(args.num_layers)]
        self.v = [torch.zeros(v_shape, dtype=dtype, device=device) for _ in range(args.num_layers)]

    @property
    def scratch_block(self) -> int:
        """A block id no request owns, for writes that must land somewhere harmless."""
        return self.num_blocks

    @staticmethod
    def bytes_per_block(args: ModelArgs, block_size: int, dtype: torch.dtype) -> int:
        """K and V of ``block_size`` tokens across all layers, in bytes."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * args.num_layers * args.num_kv_heads * args.head_dim * block_size * elem


@dataclass(frozen=True, slots=True)
class SequenceSlice:
    """One request's rows in the flat batch and what it attends over.

    ``first_row``/``num_rows``: its rows in ``[num_tokens]``; ``start_position``: the
    position of its first row; ``block_table``: block ids covering positions
    ``0 .. start_position + num_rows - 1``; ``samples``: its last row gives logits (the
    last chunk of a prompt, or a decode).
    """

    first_row: int
    num_rows: int
    start_position: int
    block_table: Sequence[int]
    samples: bool = False

    @property
    def context_len(self) -> int:
        return self.start_position + self.num_rows

    def num_blocks(self, block_size: int) -> int:
        return -(-self.context_len // block_size)

    def first_kernel_row(self, block_size: int, kernel_max_rows: int) -> int:
        """How many of its rows attend as an SDPA chunk; the rest attend through the paged
        kernel. A slice of at most ``kernel_max_rows`` rows goes through the kernel
        whole. A longer one that samples (a prompt's last chunk) sends its rows from the
        start of its last block through the kernel too: those are the rows a later
        request with the same prompt recomputes on the prefix cache (which holds every
        block before the last token), in a slice that short, so they must attend the same
        way here for the cache not to change the answer (the kernel's result for a row
        depends on that row's keys only). Needs a kernel for any rows
        (``kernel_max_rows > 1``)."""
        if self.num_rows <= kernel_max_rows:
            return 0
        if not self.samples or kernel_max_rows <= 1:
            return self.num_rows
        last_block_start = (self.context_len - 1) // block_size * block_size
        return max(0, last_block_start - self.start_position)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A prefill chunk attended with SDPA: rows ``first_row .. first_row + num_rows - 1``
    at positions from ``start_position``; ``block_ids``: ``[blocks]`` covering its
    context."""

    first_row: int
    num_rows: int
    start_position: int
    block_ids: torch.Tensor


@dataclass(frozen=True, slots=True)
class KernelRows:
    """Rows attended over the cache in place: one by one (the paged kernel), and prompt
    chunks 16 rows at a time on AMX tiles (``runs``).

    ``rows``: ``[k]`` the one-by-one rows' flat-batch rows, or ``None`` when they are all
    the batch's rows in order; ``tables``: ``[sequences, max_blocks]`` block ids (padded
    with the scratch block); ``seqs``: ``[k]`` each row's row of ``tables``; ``lens``:
    ``[k]`` keys each row sees (its position + 1); ``max_len``: the most keys any row
    sees; ``runs``: ``[r, 4]`` (first row, rows, row of ``tables``, position of the first
    row) of the chunks on tiles, or ``None``: then every row is one of ``rows``.
    """

    rows: torch.Tensor | None
    tables: torch.Tensor
    seqs: torch.Tensor
    lens: torch.Tensor
    max_len: int
    runs: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class StepBatch:
    """The flat batch of one step: ``positions`` and ``slots`` (``block * block_size +
    offset``) are ``[num_tokens]`` int64; ``cos``/``sin`` are ``[num_tokens, 1,
    head_dim]`` rows of the rotary table at ``positions``, gathered once for every
    layer."""

    num_tokens: int
    positions: torch.Tensor
    slots: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    kernel_rows: KernelRows | None
    chunks: list[Chunk]


def slot_mapping(slices: Sequence[SequenceSlice], block_size: int) -> list[int]:
    """Flat cache slot (``block * block_size + offset``) of every row, in row order."""
    slots: list[int] = []
    for s in slices:
        table = s.block_table
        slots += [
            table[pos // block_size] * block_size + pos % block_size
            for pos in range(s.start_position, s.context_len)
        ]
    return slots


def build_step(
    slices: Sequence[SequenceSlice],
    block_size: int,
    rope: RotaryTable,
    scratch_block: int,
    kernel_max_rows: int,
    device: torch.device | str = "cpu",
    tile_chunks: bool = False,
) -> StepBatch:
    """Lay out one step. Requests with at most ``kernel_max_rows`` rows attend through
    the paged kernel (``kernel_max_rows = 0``: none; 1: decodes only); the others are
    chunks, but for a prompt's last block (``SequenceSlice.first_kernel_row``): SDPA
    chunks, or with ``tile_chunks`` runs on AMX tiles (``KernelRows.runs``)."""
    positions = [p for s in slices for p in range(s.start_position, s.context_len)]
    n = len(positions)
    splits = [s.first_kernel_row(block_size, kernel_max_rows) for s in slices]
    kernel_rows = None
    pairs = list(zip(slices, splits, strict=True))
    # The sequences the kernels attend over: on tiles, every one; else those with rows
    # for the paged kernel.
    attending = pairs if tile_chunks else [(s, k) for s, k in pairs if k < s.num_rows]
    if attending:
        width = max(s.num_blocks(block_size) for s, _ in attending)
        tables = [
            list(s.block_table[: s.num_blocks(block_size)])
            + [scratch_block] * (width - s.num_blocks(block_size))
            for s, _ in attending
        ]
        rows = [s.first_row + i for s, k in attending for i in range(k, s.num_rows)]
        seqs = [j for j, (s, k) in enumerate(attending) for _ in range(k, s.num_rows)]
        lens = [s.start_position + i + 1 for s, k in attending for i in range(k, s.num_rows)]
        runs = [
            [s.first_row, k, j, s.start_position]
            for j, (s, k) in enumerate(attending)
            if tile_chunks and k > 0
        ]
        all_rows = len(rows) == n  # slices are in row order, so these are 0 .. n - 1
        kernel_rows = KernelRows(
            rows=None if all_rows else torch.tensor(rows, dtype=torch.int64, device=device),
            tables=torch.tensor(tables, dtype=torch.int64, device=device),
            seqs=torch.tensor(seqs, dtype=torch.int64, device=device),
            lens=torch.tensor(lens, dtype=torch.int64, device=device),
            max_len=max(s.context_len for s, _ in attending),
            runs=torch.tensor(runs, dtype=torch.int64, device=device) if runs else None,
        )
    chunks = [
        Chunk(
            s.first_row,
            k,
            s.start_position,
            torch.tensor(
                list(s.block_table[: -(-(s.start_position + k) // block_size)]),
                dtype=torch.int64,
                device=device,
            ),
        )
        for s, k in pairs
        if k > 0 and not tile_chunks
    ]
    pos = torch.tensor(positions, dtype=torch.int64, device=device)
    return StepBatch(
        num_tokens=n,
        positions=pos,
        slots=torch.tensor(slot_mapping(slices, block_size), dtype=torch.int64, device=device),
        cos=rope.cos[pos].unsqueeze(1),
        sin=rope.sin[pos].unsqueeze(1),
        kernel_rows=kernel_rows,
        chunks=chunks,
    )


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """``cache``: ``[kv_heads, num_blocks, *block]`` -> ``[kv_heads, len(block_ids),
    *block]``, the listed blocks in order (``block_ids`` flat).

    One ``index_select`` per head on its leading axis copies whole contiguous blocks and
    ran several times faster here than one advanced index over the block axis.
    """
    out = cache.new_empty((cache.shape[0], block_ids.numel(), *cache.shape[2:]))
    for head in range(cache.shape[0]):
        torch.index_select(cache[head], 0, block_ids, out=out[head])
    return out


def gather_context(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_ids: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``length`` positions of the blocks ``block_ids`` (``[blocks]``) as
    contiguous ``[kv_heads, length, head_dim]`` K and V."""
    kv_heads, _, hd, _ = k_cache.shape
    # [kv_heads, blocks, head_dim, block_size] -> [kv_heads, blocks * block_size, head_dim]
    k = gather_blocks(k_cache, block_ids).transpose(-1, -2).reshape(kv_heads, -1, hd)
    v = gather_blocks(v_cache, block_ids).reshape(kv_heads, -1, hd)
    return k[:, :length], v[:, :length]


class PagedAttention:
    """``Attention`` for one step: applies RoPE, writes the step's K/V at their slots,
    then attends: kernel rows through the paged kernel (or, without it, a gather and two
    batched matmuls), chunks through SDPA over their gathered context.

    ``kernels``: the CPU kernels, or ``None`` for torch ops only (no compiler, or CUDA).
    """

    def __init__(
        self,
        cache: PagedKVCache,
        step: StepBatch,
        args: ModelArgs,
        rope: RotaryTable,
        kernels: Kernels | None,
    ) -> None:
        self.cache = cache
        self.step = step
        self.args = args
        self.rope = rope
        self.kernels = kernels
        self.scale = args.head_dim**-0.5

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor:
        a, st = self.args, self.step
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
        # Attention computes in the model's dtype (the rotary table's), whatever the
        # projection handed over (bfloat16 from the float32 model's bfloat16 matmuls)
        # and whatever the cache stores (bfloat16 for it too).
        qkv = qkv.to(self.rope.cos.dtype)
        # A chunk from position 0 attends only to its own rows: it takes its K and V
        # from this step's projection rather than gathering them back from the cache.
        fresh = any(c.start_position == 0 for c in st.chunks)
        if self.kernels is not None:
            q, k = self.kernels.rope_store(
                qkv, st.positions, self.rope.cos, self.rope.sin, st.slots, k_cache, v_cache,
                a.num_heads, return_k=fresh,
            )  # fmt: skip
        else:
            q, k = self._rope_store(qkv, k_cache, v_cache)
        kr = st.kernel_rows
        if kr is not None and kr.rows is None:  # every row (decodes, short chunks)
            return self._row_attention(q, k_cache, v_cache, kr)
        out = torch.empty_like(q)  # [num_tokens, heads, head_dim]
        if kr is not None and kr.runs is not None:
            assert self.kernels is not None
            self.kernels.tile_attention(q, k_cache, v_cache, kr.tables, kr.runs, out, self.scale)
        if kr is not None and kr.lens.numel() > 0:
            assert kr.rows is not None
            out.index_copy_(0, kr.rows, self._row_attention(q[kr.rows], k_cache, v_cache, kr))
        nq_nkv = (a.num_heads + a.num_kv_heads) * a.head_dim
        v = qkv[:, nq_nkv:].view(-1, a.num_kv_heads, a.head_dim)  # [n, kv_heads, head_dim]
        # V as the cache holds it (K comes back so from rope_store), so a chunk attends to
        # the values a later step or a cached repeat reads.
        v = v.to(v_cache.dtype).to(q.dtype)
        for c in st.chunks:
            rows = slice(c.first_row, c.first_row + c.num_rows)
            if c.start_position == 0:
                assert k is not None
                # [rows, kv_heads, head_dim] -> [kv_heads, rows, head_dim] (views)
                keys, values = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
            else:
                context = c.start_position + c.num_rows
                keys, values = gather_context(k_cache, v_cache, c.block_ids, context)
                keys, values = keys.to(q.dtype), values.to(q.dtype)
            out[rows] = self._chunk_attention(q[rows], keys, values, c.start_position)
        return out

    def _row_attention(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kr: KernelRows
    ) -> torch.Tensor:
        """The kernel rows' queries ``[k, heads, head_dim]`` over the cache in place (the
        kernel), or over gathered blocks (torch ops: one query per sequence)."""
        if self.kernels is not None:
            return self.kernels.paged_attention(
                q, k_cache, v_cache, kr.tables, kr.seqs, kr.lens, kr.max_len, self.scale
            )
        return self._decode_attention(q, k_cache, v_cache, kr)

    def _rope_store(
        self, qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Torch-op version of the ``rope_store`` kernel; returns the rotated queries
        ``[n, heads, head_dim]`` and keys ``[n, kv_heads, head_dim]``."""
        a, st = self.args, self.step
        n, hd = qkv.shape[0], a.head_dim
        nq, nkv = a.num_heads * hd, a.num_kv_heads * hd
        q = rotate(qkv[:, :nq].view(n, a.num_heads, hd), st.cos, st.sin)
        k = rotate(qkv[:, nq : nq + nkv].view(n, a.num_kv_heads, hd), st.cos, st.sin)
        v = qkv[:, nq + nkv :].view(n, a.num_kv_heads, hd)
        bs = self.cache.block_size
        blocks, offsets = st.slots // bs, st.slots % bs
        # Advanced indices split by a slice put their axis first: k_cache[:, b, :, o] is
        # [n, kv_heads, head_dim], as k is.
        k_cache[:, blocks, :, offsets] = k.to(k_cache.dtype)
        v_cache[:, blocks, offsets] = v.transpose(0, 1).to(v_cache.dtype)
        return q, k.to(k_cache.dtype).to(q.dtype)

    def _decode_attention(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kr: KernelRows
    ) -> torch.Tensor:
        """One query per sequence (decodes) over gathered blocks, softmax in float32.
        ``q``: ``[seqs, heads, head_dim]``; shapes depend only on ``kr.tables``' shape, so
        a CUDA graph can capture this."""
        a = self.args
        seqs, width = kr.tables.shape
        kv_heads, _, hd, bs = k_cache.shape
        ids = kr.tables.view(-1)
        keys_t = gather_blocks(k_cache, ids).view(kv_heads, seqs, width, hd, bs).to(q.dtype)
        values = gather_blocks(v_cache, ids).view(kv_heads, seqs, width * bs, hd).to(q.dtype)
        # The query heads that share a KV head are folded into the query axis, so K/V
        # are never repeated per head: [kv_heads, seqs, group, head_dim]. Scores are taken
        # block by block against the transposed blocks as stored (q broadcast over the
        # blocks), so no transposing copy of K is made.
        qg = q.view(seqs, kv_heads, a.group_size, hd).transpose(0, 1)
        scores = torch.matmul((qg * self.scale).unsqueeze(2), keys_t)  # [.., width, group, bs]
        scores = scores.transpose(2, 3).reshape(kv_heads, seqs, a.group_size, -1).float()
        key_pos = torch.arange(width * bs, device=q.device)
        hidden = key_pos[None, :] >= kr.lens[:, None]  # [seqs, keys]
        scores = scores.masked_fill_(hidden[None, :, None, :], -torch.inf)
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        o = torch.matmul(probs, values)  # [kv_heads, seqs, group, head_dim]
        return o.transpose(0, 1).reshape(seqs, a.num_heads, hd)

    def _chunk_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start_position: int
    ) -> torch.Tensor:
        """A prefill chunk: ``q`` ``[rows, heads, head_dim]`` over ``keys``/``values``
        ``[kv_heads, context, head_dim]``, its whole context.

        Query ``i`` sits at position ``start_position + i`` and sees keys at positions
        ``<= start_position + i``. A chunk from position 0 is SDPA's own causal case
        (whose fused kernel skips the masked half); a chunk that starts mid-sequence
        passes that comparison as a mask.
        """
        rows, context = q.shape[0], keys.shape[1]
        if q.device.type == "cpu":
            # Bucketed shapes (buckets.py). Padded keys sit past every real query's
            # position, so the causal rule masks them; padded queries are dropped.
            padded = padded_rows(rows)
            width = padded if start_position == 0 else padded_context(context)
            q = pad_dim(q, 0, padded)
            keys, values = pad_dim(keys, 1, width), pad_dim(values, 1, width)
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, rows, head_dim]
        k, v = keys.unsqueeze(0), values.unsqueeze(0)  # [1, kv_heads, context, head_dim]
        if start_position == 0:
            o = F.scaled_dot_product_attention(
                qh, k, v, is_causal=True, scale=self.scale, enable_gqa=True
            )
        else:
            n_queries, n_keys = qh.shape[2], k.shape[2]
            query_pos = torch.arange(start_position, start_position + n_queries, device=q.device)
            allowed = torch.arange(n_keys, device=q.device)[None, :] <= query_pos[:, None]
            o = F.scaled_dot_product_attention(
                qh, k, v, attn_mask=allowed, scale=self.scale, enable_gqa=True
            )
        return o[0, :, :rows].transpose(0, 1)  # [rows, heads, head_dim]
