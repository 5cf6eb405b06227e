"""The token ids our scheduler's KV blocks stand for.

TensorRT-LLM's executor takes a request's whole token list at once, but a plan carries
only the tokens run this step: the positions before ``start_position`` were sent in
earlier steps, or are a prefix-cache hit on blocks another request filled. Every token
the scheduler counts as computed was in some plan, in block ``block_table[p // size]`` at
offset ``p % size``, so recording each plan's tokens by block lets the adapter rebuild any
request's known tokens from its block table, whatever chunking or prefix sharing the
scheduler did. A shared block is never rewritten while shared: the KV manager shares only
full blocks and hands a block out again only once its content is dropped.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence


class BlockTokens:
    """Token ids by KV block: ``num_blocks`` blocks of ``block_size`` tokens, 4 bytes
    per token (the memory of a real cache's worth of ids is a few MB)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need at least one block of one token, got {num_blocks} x {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ids = array("i", bytes(4 * num_blocks * block_size))

    def write(self, block_table: Sequence[int], start: int, token_ids: Sequence[int]) -> None:
        """Record ``token_ids`` at positions ``start ..`` of the request whose blocks are
        ``block_table``."""
        size = self.block_size
        position, done = start, 0
        while done < len(token_ids):
            block, offset = divmod(position, size)
            n = min(size - offset, len(token_ids) - done)
            base = self._slot(block_table, block) + offset
            self._ids[base : base + n] = array("i", token_ids[done : done + n])
            position, done = position + n, done + n

    def read(self, block_table: Sequence[int], length: int) -> list[int]:
        """The token ids at positions ``0 .. length - 1`` of the request whose blocks are
        ``block_table``."""
        size = self.block_size
        out: list[int] = []
        for block in range(-(-length // size)):
            base = self._slot(block_table, block)
            out.extend(self._ids[base : base + min(size, length - block * size)])
        return out

    def _slot(self, block_table: Sequence[int], index: int) -> int:
        if index >= len(block_table):
            raise ValueError(
                f"block table {list(block_table)} does not cover position {index * self.block_size}"
            )
        block_id = block_table[index]
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block id {block_id} is outside the pool of {self.num_blocks} blocks")
        return block_id * self.block_size
