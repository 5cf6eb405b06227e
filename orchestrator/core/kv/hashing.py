"""Prefix-cache block hashes: SHA-256 chained over token bytes, seeded.

A full block's hash is ``SHA-256(parent digest || token ids as little-endian uint32)``;
the first block's parent is ``SHA-256(seed)``. So equal prefixes give equal hashes in
every process and on every replica that share a seed (which KV-aware routing needs),
and without the seed nobody can craft a prompt whose blocks collide with another
tenant's (the prefix-cache poisoning that an unkeyed hash such as Python's ``hash``
allows). Digests are 32-byte ``bytes``.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence

BlockHash = bytes

_TOKEN_MAX = 2**32


def root_hash(seed: str | None) -> BlockHash:
    """The parent of every first block. ``None`` draws a random seed: hashes then agree
    only within this process, and cannot be predicted from outside it."""
    material = os.urandom(32) if seed is None else seed.encode()
    return hashlib.sha256(b"orchestrator-prefix-v1\x00" + material).digest()


def block_hash(parent: BlockHash, tokens: Sequence[int]) -> BlockHash:
    """Hash of one full block of ``tokens`` whose preceding block hashed to ``parent``.

    Raises ``ValueError`` for a token id outside ``[0, 2**32)``, which no vocabulary has.
    """
    try:
        data = struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error:
        bad = next(t for t in tokens if not 0 <= t < _TOKEN_MAX)
        raise ValueError(f"token id {bad} is outside [0, 2**32)") from None
    return hashlib.sha256(parent + data).digest()


def prefix_hashes(root: BlockHash, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Hashes of every full block of ``token_ids``, first block first."""
    hashes = []
    parent = root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes
