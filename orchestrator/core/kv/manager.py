"""Paged KV cache manager: which blocks each request holds, prefix caching, and the
admission headroom.

Block ``i`` of a request holds its token positions ``[i * block_size, (i + 1) *
block_size)``. A full block is identified by a chained SHA-256 hash of its tokens and its
parent's hash (``orchestrator.core.kv.hashing``, in the configured scheme), so equal
prefixes map to equal hashes and a new request can reuse blocks another request computed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.core.kv.block_pool import BlockPool
from orchestrator.core.kv.events import BlockStored, KVEvent
from orchestrator.core.kv.hashing import BlockHash, prefix_hasher
from orchestrator.core.request import Request


class AllocationRule(Protocol):
    """Where an executor's own KV picture bounds the manager's allocations; chosen once,
    when the manager is built, and asked only off ``allocate``'s common path (a request's
    first allocation since it last held no blocks, or one that needs new blocks).

    ``first_tokens(request, num_new_tokens)``: how many tokens past those computed the
    first allocation of a request holding no blocks covers (at least
    ``num_new_tokens``). ``free_blocks(pool_free, executor_shortfall)``: the free blocks
    an allocation may take, given this pool's count and how many fewer the executor last
    reported free.
    """

    def first_tokens(self, request: Request, num_new_tokens: int) -> int: ...

    def free_blocks(self, pool_free: int, executor_shortfall: int) -> int: ...


class OwnPool:
    """The manager's pool is the truth (every executor but a mirrored one): a first
    allocation covers the tokens asked for, and every free block of the pool may be
    taken (the executor's count bounds only admission, ``can_admit``)."""

    def first_tokens(self, request: Request, num_new_tokens: int) -> int:
        return num_new_tokens

    def free_blocks(self, pool_free: int, executor_shortfall: int) -> int:
        return pool_free


class MirrorExecutor:
    """The executor's own KV manager is the truth (TensorRT-LLM's in-executor mode): a
    request that holds no blocks gets blocks for all its known tokens on its first
    chunk, as that manager allocates a sequence, and no allocation takes blocks beyond
    the executor's last reported free count."""

    def first_tokens(self, request: Request, num_new_tokens: int) -> int:
        return max(num_new_tokens, request.num_tokens - request.num_computed_tokens)

    def free_blocks(self, pool_free: int, executor_shortfall: int) -> int:
        return pool_free - executor_shortfall


@dataclass(slots=True)
class _RequestBlocks:
    """Everything the manager keeps for one request.

    ``blocks`` is its block table; ``snapshot`` an immutable copy, what ``allocate``
    hands out, rebuilt only when the table changes (a decode needs a new block once
    every ``block_size`` steps);
    ``hashes`` the prefix hashes of its full blocks, extended as tokens arrive and kept
    across preemption (the tokens are kept); ``num_committed`` how many of its blocks are
    registered in the prefix cache.
    """

    blocks: list[int] = field(default_factory=list)
    snapshot: tuple[int, ...] | None = None
    hashes: list[BlockHash] = field(default_factory=list)
    num_committed: int = 0


class KVCacheManager:
    """Owns the blocks of every live request.

    ``allocate`` answers ``blocks | None``: ``None`` means the pool cannot hold the
    request's next tokens, and the scheduler starts preemption. ``can_admit`` applies the
    admission headroom: ``headroom_blocks`` free blocks per running request stay free
    when a new request is admitted. Where the executor owns the real KV cache and
    reports its free blocks (``observe_executor_free``), admission uses the tighter of
    the two pictures. The allocation rule is chosen here (``rule``): ``OwnPool``, or
    ``MirrorExecutor`` with ``mirror_executor``, where the executor's own KV manager is
    the truth (TensorRT-LLM's in-executor mode). All counts are blocks unless a name
    says tokens.

    ``hash_scheme`` and ``hash_seed`` pick the prefix hashes (``cache.prefix_hash`` and
    ``cache.prefix_hash_seed``). After ``record_events`` the manager buffers KV events
    (``orchestrator.core.kv.events``) until ``take_events``; before it, it records none.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        *,
        headroom_blocks: int = 1,
        hash_seed: str | None = None,
        hash_scheme: str = "orchestrator",
        mirror_executor: bool = False,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.headroom_blocks = headroom_blocks
        self.rule: AllocationRule = MirrorExecutor() if mirror_executor else OwnPool()
        self.pool = BlockPool(num_blocks)
        self.hasher = prefix_hasher(hash_scheme, hash_seed)
        self._records: dict[str, _RequestBlocks] = {}
        self.records_events = False
        self._events: list[KVEvent] = []
        # How many fewer blocks the executor had free than this pool at its last report
        # (0 when it reports none, or has more): our allocations since then move both.
        self._executor_shortfall = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_admit(self, num_new_blocks: int, num_running: int) -> bool:
        """Whether a new request needing ``num_new_blocks`` may start beside
        ``num_running`` running requests without eating their headroom."""
        need = num_new_blocks + num_running * self.headroom_blocks
        return need <= self.pool.num_free - self._executor_shortfall

    def observe_executor_free(self, free_blocks: int) -> None:
        """Record the executor's own count of free blocks, read just now. An executor
        that allocates ahead of the scheduler (TensorRT-LLM reserves blocks for tokens it
        will generate) may have fewer free than this pool believes."""
        self._executor_shortfall = max(0, self.pool.num_free - free_blocks)

    def block_table(self, request_id: str) -> list[int]:
        """A copy of the request's block table (empty when it holds no blocks)."""
        record = self._records.get(request_id)
        return list(record.blocks) if record is not None else []

    def block_tables(self) -> dict[str, tuple[int, ...]]:
        """Every request that holds blocks, with its block table."""
        return {rid: tuple(r.blocks) for rid, r in self._records.items() if r.blocks}

    def _hash_chain(self, request: Request) -> Iterator[BlockHash]:
        """Hashes of the request's full blocks, first block first, computed lazily (a
        probe stops at the first one not cached)."""
        bs = self.block_size
        block_hash = self.hasher.block_hash
        parent = self.hasher.root
        for i in range(request.num_tokens // bs):
            parent = block_hash(parent, request.token_ids(i * bs, (i + 1) * bs))
            yield parent

    def _hashes(self, request: Request) -> list[BlockHash]:
        """Hashes of every full block of the request's known tokens, kept on its record."""
        record = self._records.get(request.request_id)
        if record is None:
            record = self._records[request.request_id] = _RequestBlocks()
        hashes = record.hashes
        self._extend_hashes(request, hashes, request.num_tokens // self.block_size)
        return hashes

    def _extend_hashes(self, request: Request, hashes: list[BlockHash], stop: int) -> None:
        """Extend ``hashes``, the request's first full blocks' hashes, to its first
        ``stop`` blocks. A loop, not a generator like ``_hash_chain``'s: a running request
        fills one block at a time, and a generator costs more than that block's hash."""
        bs = self.block_size
        block_hash = self.hasher.block_hash
        parent = hashes[-1] if hashes else self.hasher.root
        for i in range(len(hashes), stop):
            parent = block_hash(parent, request.token_ids(i * bs, (i + 1) * bs))
            hashes.append(parent)

    def _cached_run(self, hashes: Iterable[BlockHash], num_tokens: int) -> list[int]:
        """Cached blocks of the longest prefix of ``hashes``, leaving at least one of
        ``num_tokens`` to compute, so the step that finishes the known tokens can
        sample the next one."""
        hits = []
        for h in hashes:
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        if hits and len(hits) * self.block_size >= num_tokens:
            hits.pop()
        return hits

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Cached blocks matching the longest prefix of a request that holds no blocks
        (at least one token is always left to compute)."""
        if not self.enable_prefix_caching:
            return []
        return self._cached_run(self._hashes(request), request.num_tokens)

    def probe_cached_tokens(self, request: Request) -> int:
        """Tokens ``find_cached_prefix`` would supply to ``request`` now (a multiple of
        the block size; 0 without prefix caching). Records nothing, so a request refused
        after the probe leaves no trace; hashing stops at the first block not cached."""
        if not self.enable_prefix_caching:
            return 0
        return len(self._cached_run(self._hash_chain(request), request.num_tokens)) * (
            self.block_size
        )

    def allocate(
        self, request: Request, num_new_tokens: int, cached_prefix: list[int] | None = None
    ) -> tuple[int, ...] | None:
        """Make the request's blocks cover ``num_new_tokens`` positions past those already
        computed, first taking ``cached_prefix`` (from ``find_cached_prefix``, for a
        request that holds no blocks yet; the new tokens then start right after the
        prefix, whose tokens the caller marks computed on success). A request that holds
        no blocks covers what the rule's ``first_tokens`` says. Returns the request's
        block table as a tuple that later allocations do not change (the same one until
        the table changes, so a plan may keep it), or ``None`` with nothing changed when
        the pool cannot hold it."""
        rid = request.request_id
        record = self._records.get(rid)
        bs = self.block_size
        if record is not None and (held := record.blocks):
            if cached_prefix:
                raise ValueError(f"request {rid!r} already holds blocks; no prefix to reuse")
            need = -(-(request.num_computed_tokens + num_new_tokens) // bs) - len(held)
            if need <= 0:
                # The common case: a running request's next tokens fit its blocks.
                snapshot = record.snapshot
                if snapshot is None:
                    snapshot = record.snapshot = tuple(held)
                return snapshot
            # The next common one: a decode filled its last block (once every
            # ``block_size`` steps per request); no prefix to reclaim.
            pool = self.pool
            if need > self.rule.free_blocks(pool.num_free, self._executor_shortfall):
                return None
            if need == 1:
                held.append(pool.allocate_one())
            else:
                held.extend(pool.allocate(need))
            snapshot = record.snapshot = tuple(held)
            return snapshot
        # A first allocation: the request holds no blocks.
        if num_new_tokens > 0:
            num_new_tokens = self.rule.first_tokens(request, num_new_tokens)
        start = len(cached_prefix) * bs if cached_prefix else request.num_computed_tokens
        need = -(-(start + num_new_tokens) // bs) - len(cached_prefix or ())
        # Reusing a cached block with no owner takes it out of the free queue.
        reclaimed = sum(1 for b in cached_prefix or () if self.pool.ref_counts[b] == 0)
        free = self.rule.free_blocks(self.pool.num_free, self._executor_shortfall)
        if max(need, 0) + reclaimed > free:
            return None
        if record is None:
            record = self._records[rid] = _RequestBlocks()
        if cached_prefix:
            self.pool.touch(cached_prefix)
            record.blocks.extend(cached_prefix)
            record.num_committed = len(cached_prefix)
        if need > 0:
            record.blocks.extend(self.pool.allocate(need))
        snapshot = record.snapshot = tuple(record.blocks)
        return snapshot

    def commit(self, request: Request) -> None:
        """Register the request's newly full, computed blocks in the prefix cache. Call
        after ``num_computed_tokens`` moved forward."""
        record = self._records[request.request_id]
        bs = self.block_size
        full = request.num_computed_tokens // bs
        done = record.num_committed
        if full <= done or not self.enable_prefix_caching:
            return
        hashes = record.hashes
        if full == done + 1 and len(hashes) == done and not self.records_events:
            # Most commits: a decode filled one block, not hashed before. Inline, without
            # the loops below: it happens to every running request once every
            # ``block_size`` steps (about 64 times a step at 1,024 running).
            parent = hashes[-1] if done else self.hasher.root
            block_hash = self.hasher.block_hash(parent, request.token_ids(done * bs, full * bs))
            hashes.append(block_hash)
            self.pool.cache(record.blocks[done], block_hash)
        else:
            if len(hashes) < full:
                self._extend_hashes(request, hashes, full)
            self._cache_blocks(request, record.blocks, hashes, done, full)
        record.num_committed = full

    def _cache_blocks(
        self, request: Request, blocks: list[int], hashes: list[BlockHash], start: int, stop: int
    ) -> None:
        """Register ``blocks[start:stop]`` of ``request`` under ``hashes[start:stop]``."""
        cache = self.pool.cache
        for i in range(start, stop):
            cache(blocks[i], hashes[i])

    def _cache_blocks_recording(
        self, request: Request, blocks: list[int], hashes: list[BlockHash], start: int, stop: int
    ) -> None:
        """``_cache_blocks``, with one ``BlockStored`` per run of consecutive blocks that
        were registered (a block whose hash another block holds breaks the run)."""
        cache = self.pool.cache
        run = start
        for i in range(start, stop):
            if not cache(blocks[i], hashes[i]):
                self._stored(request, hashes, run, i)
                run = i + 1
        self._stored(request, hashes, run, stop)

    def _stored(self, request: Request, hashes: list[BlockHash], start: int, stop: int) -> None:
        """Record that blocks ``start .. stop - 1`` of ``request`` were stored (none when
        the range is empty)."""
        if start < stop:
            bs = self.block_size
            self._events.append(
                BlockStored(
                    block_hashes=tuple(hashes[start:stop]),
                    parent_block_hash=hashes[start - 1] if start else None,
                    token_ids=tuple(request.token_ids(start * bs, stop * bs)),
                    block_size=bs,
                )
            )

    def record_events(self) -> None:
        """Buffer KV events from now on: ``BlockStored`` when ``commit`` registers full
        blocks, ``BlockRemoved`` when an allocation evicts cached ones. Blocks cached before
        this call are never reported, so call it before the first step. Calling it again
        changes nothing."""
        if not self.records_events:
            self.records_events = True
            # Chosen once here, so a manager nobody listens to runs the plain loop.
            self._cache_blocks = self._cache_blocks_recording  # type: ignore[method-assign]
            self.pool.record_evictions(self._events)

    def take_events(self) -> list[KVEvent]:
        """The events buffered since the last call, oldest first (a new list, the
        caller's to keep); empty unless ``record_events`` was called."""
        events = self._events[:]
        self._events.clear()
        return events

    def free(self, request: Request, keep_hashes: bool = False) -> None:
        """Release the request's blocks (tail first). ``keep_hashes`` keeps its prefix
        hashes for a preempted request that will come back with the same tokens."""
        rid = request.request_id
        record = self._records.get(rid)
        if record is None:
            return
        if record.blocks:
            self.pool.release(reversed(record.blocks))
        if keep_hashes:
            record.blocks, record.snapshot, record.num_committed = [], None, 0
        else:
            del self._records[rid]

    def integrity_check(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant:
        free + used + cached-only == total; a free-queue block has no references and every
        unreferenced block is queued; reference counts equal owners; no request owns a
        block twice; the hash index and the blocks agree."""
        pool = self.pool
        owners = [0] * pool.num_blocks
        for rid, record in self._records.items():
            blocks = record.blocks
            assert len(set(blocks)) == len(blocks), f"request {rid} owns a block twice"
            for b in blocks:
                owners[b] += 1
            if record.snapshot is not None:
                assert record.snapshot == tuple(blocks), f"stale block table for {rid}"
            assert record.num_committed <= len(blocks), f"{rid} committed unheld blocks"
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
        for h, b in pool.cached.items():
            assert pool.block_hashes[b] == h, f"hash index points at block {b} wrongly"
        assert sum(h is not None for h in pool.block_hashes) == len(pool.cached)
