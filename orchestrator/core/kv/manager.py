"""Paged KV cache manager: which blocks each request holds, and prefix caching.

Block ``i`` of a request holds its token positions ``[i * block_size, (i + 1) *
block_size)``. A full block is identified by a chained hash of its tokens and its
parent's hash, so equal prefixes map to equal hashes and a new request can reuse blocks
another request computed.
"""

from __future__ import annotations

from orchestrator.core.kv.block_pool import BlockPool
from orchestrator.core.request import Request


def block_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """Hash of a full block given its parent's hash. Python's tuple hash of ints is
    deterministic across processes (no randomisation for ints)."""
    return hash((parent, tokens))


class KVCacheManager:
    """Owns the blocks of every live request.

    ``allocate`` answers ``blocks | None``: ``None`` means the pool cannot hold the
    request's next tokens, and the scheduler starts preemption. All counts are blocks
    unless a name says tokens.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.req_blocks: dict[str, list[int]] = {}
        # Immutable copies of block tables for plans, rebuilt only when a table changes
        # (a decode needs a new block once every block_size steps).
        self._snapshots: dict[str, tuple[int, ...]] = {}
        # Prefix hashes of a request's full blocks, computed once and extended as tokens
        # arrive; kept across preemption because the tokens are kept.
        self._hashes: dict[str, list[int]] = {}
        # How many of a request's blocks are registered in the prefix cache.
        self._num_cached: dict[str, int] = {}

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    def usage(self) -> float:
        """Fraction of blocks held by live requests (cached-only blocks count as free)."""
        return self.pool.num_used / self.pool.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_table(self, request_id: str) -> list[int]:
        return self.req_blocks.get(request_id, [])

    def block_table_snapshot(self, request_id: str) -> tuple[int, ...]:
        """The request's block table as a tuple that later allocations do not change."""
        snapshot = self._snapshots.get(request_id)
        if snapshot is None:
            snapshot = self._snapshots[request_id] = tuple(self.req_blocks[request_id])
        return snapshot

    def _block_hashes(self, request: Request) -> list[int]:
        """Hashes of every full block of the request's known tokens."""
        hashes = self._hashes.setdefault(request.request_id, [])
        bs = self.block_size
        full = request.num_tokens // bs
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), full):
            parent = block_hash(parent, tuple(request.token_ids(i * bs, (i + 1) * bs)))
            hashes.append(parent)
        return hashes

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Cached blocks matching the longest prefix of a request that holds no blocks.

        At least one token is always left to compute, so the step that finishes the
        request's known tokens can sample the next one.
        """
        if not self.enable_prefix_caching:
            return []
        hits = []
        for h in self._block_hashes(request):
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        if hits and len(hits) * self.block_size >= request.num_tokens:
            hits.pop()
        return hits

    def allocate(
        self, request: Request, num_new_tokens: int, cached_prefix: list[int] | None = None
    ) -> list[int] | None:
        """Make the request's blocks cover ``num_new_tokens`` positions past those already
        computed, first taking ``cached_prefix`` (from ``find_cached_prefix``, for a
        request that holds no blocks yet; the new tokens then start right after the
        prefix, whose tokens the caller marks computed on success). Returns the request's block table, or ``None``
        with nothing changed when the pool cannot hold it."""
        rid = request.request_id
        blocks = self.req_blocks.get(rid)
        if blocks is not None and not cached_prefix:
            # Hot path (a running request's next tokens): most steps need no new block.
            positions = request.num_computed_tokens + num_new_tokens
            need = -(-positions // self.block_size) - len(blocks)
            if need <= 0:
                return blocks
            if need > self.pool.num_free:
                return None
            blocks.extend(self.pool.allocate(need))
            self._snapshots.pop(rid, None)
            return blocks
        prefix = cached_prefix or []
        if blocks is None:
            blocks = []
        elif prefix:
            raise ValueError(f"request {rid!r} already holds blocks; no prefix to reuse")
        # A reused prefix counts as computed: the new tokens start after it.
        start = len(prefix) * self.block_size if prefix else request.num_computed_tokens
        need = self.blocks_for(start + num_new_tokens) - len(blocks) - len(prefix)
        # Reusing a cached block with no owner takes it out of the free queue.
        reclaimed = sum(1 for b in prefix if self.pool.ref_counts[b] == 0)
        if max(need, 0) + reclaimed > self.pool.num_free:
            return None
        if rid not in self.req_blocks:
            self.req_blocks[rid] = blocks
        if prefix:
            self.pool.touch(prefix)
            blocks.extend(prefix)
            self._num_cached[rid] = len(prefix)
        if need > 0:
            blocks.extend(self.pool.allocate(need))
        self._snapshots.pop(rid, None)
        return blocks

    def commit(self, request: Request) -> None:
        """Register the request's newly full, computed blocks in the prefix cache. Call
        after ``num_computed_tokens`` moved forward."""
        rid = request.request_id
        full = request.num_computed_tokens // self.block_size
        done = self._num_cached.get(rid, 0)
        if full <= done or not self.enable_prefix_caching:
            return
        hashes = self._block_hashes(request)
        blocks = self.req_blocks[rid]
        for i in range(done, full):
            self.pool.cache(blocks[i], hashes[i])
        self._num_cached[rid] = full

    def free(self, request: Request, keep_hashes: bool = False) -> None:
        """Release the request's blocks (tail first). ``keep_hashes`` keeps its prefix
        hashes for a preempted request that will come back with the same tokens."""
        rid = request.request_id
        blocks = self.req_blocks.pop(rid, None)
        self._snapshots.pop(rid, None)
        if blocks:
            self.pool.release(reversed(blocks))
        self._num_cached.pop(rid, None)
        if not keep_hashes:
            self._hashes.pop(rid, None)

    def integrity_check(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant:
        free + used + cached-only == total; a free-queue block has no references and every
        unreferenced block is queued; reference counts equal owners; no request owns a
        block twice; the hash index and the blocks agree."""
        pool = self.pool
        owners = [0] * pool.num_blocks
        for rid, blocks in self.req_blocks.items():
            assert len(set(blocks)) == len(blocks), f"request {rid} owns a block twice"
            for b in blocks:
                owners[b] += 1
        assert owners == pool.ref_counts, "reference counts differ from owners"
        used = sum(1 for c in pool.ref_counts if c > 0)
        assert used == pool.num_used, f"used counter {pool.num_used} != {used}"
        queued = set(pool.free_queue)
        assert len(queued) == len(pool.free_queue)
        unreferenced = {b for b, c in enumerate(pool.ref_counts) if c == 0}
        assert queued == unreferenced, "free queue differs from unreferenced blocks"
        cached_only = sum(1 for b in queued if pool.block_hashes[b] is not None)
        free = len(queued) - cached_only
        assert free + used + cached_only == pool.num_blocks, "blocks leaked"
        for rid, snapshot in self._snapshots.items():
            assert snapshot == tuple(self.req_blocks[rid]), f"stale block table for {rid}"
        for h, b in pool.cached.items():
            assert pool.block_hashes[b] == h, f"hash index points at block {b} wrongly"
        assert sum(h is not None for h in pool.block_hashes) == len(pool.cached)
