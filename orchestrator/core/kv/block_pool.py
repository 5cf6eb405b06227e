"""A pool of KV blocks as plain ints: ids, reference counts, prefix hashes and a free
queue in least-recently-used order. No tensors: an executor maps block ids to memory."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from itertools import islice

from orchestrator.core.kv.events import BlockRemoved, KVEvent
from orchestrator.core.kv.hashing import BlockHash


class BlockPool:
    """Blocks ``0 .. num_blocks - 1``.

    A block is *used* while its reference count is positive. A block with no references
    sits in the free queue; if it still carries a prefix hash it is *cached*: a new
    request with the same prefix can take it back (``touch``) instead of recomputing it.
    New blocks come from the front of the free queue (least recently freed), evicting
    the cached hash they carry.

    With ``record_evictions`` each eviction is also reported as a ``BlockRemoved``.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[BlockHash | None] = [None] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[BlockHash, int] = {}  # prefix hash -> block id
        self.num_used = 0

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (cached ones included: they are evictable)."""
        return len(self.free_queue)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the free queue; the caller checked ``n <= num_free``."""
        if n > len(self.free_queue):
            raise RuntimeError(f"asked for {n} blocks with {len(self.free_queue)} free")
        # The class's own ``allocate_one``: ``record_evictions`` replaces the instance's,
        # which records through this method.
        take = BlockPool.allocate_one
        return [take(self) for _ in range(n)]

    def allocate_one(self) -> int:
        """The front block of the free queue, evicting the cached hash it carries, with
        one reference: ``allocate(1)``'s block without the list (a running request's next
        block, the common allocation). The caller checked ``num_free >= 1``."""
        block, _ = self.free_queue.popitem(last=False)
        h = self.block_hashes[block]
        if h is not None:
            del self.cached[h]
            self.block_hashes[block] = None
        self.ref_counts[block] = 1
        self.num_used += 1
        return block

    def record_evictions(self, events: list[KVEvent]) -> None:
        """From now on, append to ``events`` one ``BlockRemoved`` per ``allocate`` (or
        ``allocate_one``) that evicts cached hashes, naming exactly those hashes in
        eviction order."""
        self._events = events
        # Chosen once here, so a pool nobody listens to runs the plain loop unchanged.
        self.allocate = self._allocate_recording  # type: ignore[method-assign]
        self.allocate_one = self._allocate_one_recording  # type: ignore[method-assign]

    def _allocate_recording(self, n: int) -> list[int]:
        # ``allocate`` takes the first ``n`` queued blocks in order: their hashes go.
        hashes = self.block_hashes
        evicted = tuple(h for b in islice(self.free_queue, n) if (h := hashes[b]) is not None)
        blocks = BlockPool.allocate(self, n)
        if evicted:
            self._events.append(BlockRemoved(evicted))
        return blocks

    def _allocate_one_recording(self) -> int:
        return self._allocate_recording(1)[0]

    def touch(self, blocks: Iterable[int]) -> None:
        """Add a reference to cached blocks a new owner reuses."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
                self.num_used += 1
            self.ref_counts[block] += 1

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one reference from each block; blocks left with none join the free queue's
        back in the order given (pass a sequence's blocks tail first, so its tail is
        evicted before the prefix other requests are likelier to share)."""
        for block in blocks:
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None
                self.num_used -= 1

    def cache(self, block: int, block_hash: BlockHash) -> bool:
        """Register a full, computed block under its prefix hash; returns whether it was
        registered. A hash already cached under another block keeps that block (two
        requests computed the same content)."""
        if block_hash not in self.cached and self.block_hashes[block] is None:
            self.cached[block_hash] = block
            self.block_hashes[block] = block_hash
            return True
        return False

    def lookup(self, block_hash: BlockHash) -> int | None:
        return self.cached.get(block_hash)
