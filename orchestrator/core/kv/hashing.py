"""Prefix-cache block hashes, in one of two schemes chosen by ``cache.prefix_hash``.

``orchestrator`` (the default): a full block's hash is ``SHA-256(parent digest || token
ids as little-endian uint32)``; the first block's parent is ``SHA-256(seed)``. So equal
prefixes give equal hashes in every process and on every replica that share a seed
(which KV-aware routing needs), and without the seed nobody can craft a prompt whose
blocks collide with another tenant's (the prefix-cache poisoning that an unkeyed hash
such as Python's ``hash`` allows).

``vllm_sha256_cbor``: vLLM's own ``sha256_cbor`` block hashes (vLLM 0.32), so a router
that computes vLLM's hashes from a prompt (llm-d's precise prefix-cache scorer) finds our
blocks. A block hashes to ``SHA-256(canonical CBOR of (parent digest, token ids, None))``
(the ``None`` is vLLM's extra keys of a plain-text request: no LoRA, multi-modal input,
cache salt or prompt embeddings); the first block's parent is vLLM's ``NONE_HASH``,
``SHA-256(CBOR(seed))``. Our ``prefix_hash_seed`` plays the role of vLLM's
``PYTHONHASHSEED``; unset, it is vLLM's fixed ``"vllm-none-hash"``, as vLLM uses for
``sha256_cbor`` when ``PYTHONHASHSEED`` is unset (SHA-256 resists collisions without a
secret seed).

Digests are 32-byte ``bytes`` in both schemes.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

BlockHash = bytes

_TOKEN_MAX = 2**32

# vLLM's seed of NONE_HASH when PYTHONHASHSEED is unset (``DEFAULT_NONE_HASH_SEED``).
VLLM_DEFAULT_SEED = "vllm-none-hash"

CBORValue = None | int | bytes | str | tuple["CBORValue", ...] | list["CBORValue"]


def root_hash(seed: str | None) -> BlockHash:
    """The parent of every first block (``orchestrator`` scheme). ``None`` draws a random
    seed: hashes then agree only within this process, and cannot be predicted from
    outside it."""
    material = os.urandom(32) if seed is None else seed.encode()
    return hashlib.sha256(b"orchestrator-prefix-v1\x00" + material).digest()


def _uint32_packer(n: int) -> Callable[..., bytes]:
    """Packs ``n`` ints as little-endian uint32; ``block_hash`` keeps one per length, as
    a format string built per call costs about half the SHA-256 it feeds."""
    pack = _PACKERS[n] = struct.Struct(f"<{n}I").pack
    return pack


_PACKERS: dict[int, Callable[..., bytes]] = {}


def block_hash(parent: BlockHash, tokens: Sequence[int]) -> BlockHash:
    """Hash of one full block of ``tokens`` whose preceding block hashed to ``parent``
    (``orchestrator`` scheme).

    Raises ``ValueError`` for a token id outside ``[0, 2**32)``, which no vocabulary has.
    """
    try:
        data = (_PACKERS.get(len(tokens)) or _uint32_packer(len(tokens)))(*tokens)
    except struct.error:
        bad = next(t for t in tokens if not 0 <= t < _TOKEN_MAX)
        raise ValueError(f"token id {bad} is outside [0, 2**32)") from None
    return hashlib.sha256(parent + data).digest()


def prefix_hashes(root: BlockHash, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Hashes of every full block of ``token_ids``, first block first (``orchestrator``
    scheme)."""
    return PrefixHasher(root, block_hash).prefix_hashes(token_ids, block_size)


def _head(major: int, n: int) -> bytes:
    """A CBOR item head: major type ``major`` (shifted into the top 3 bits) with
    argument ``n``, in the shortest form (RFC 8949 section 4.2.1, as ``cbor2`` writes)."""
    if n < 24:
        return bytes((major | n,))
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return bytes((major | 25,)) + n.to_bytes(2, "big")
    if n < 0x1_0000_0000:
        return bytes((major | 26,)) + n.to_bytes(4, "big")
    if n < 0x1_0000_0000_0000_0000:
        return bytes((major | 27,)) + n.to_bytes(8, "big")
    raise ValueError(f"{n} does not fit a CBOR integer (64 bits)")


def _encode(value: CBORValue, out: bytearray) -> None:
    if value is None:
        out.append(0xF6)
    elif type(value) is int:  # bool is an int, but CBOR gives it other bytes: refused below
        out += _head(0x00, value) if value >= 0 else _head(0x20, -1 - value)
    elif isinstance(value, bytes):
        out += _head(0x40, len(value))
        out += value
    elif isinstance(value, str):
        data = value.encode()
        out += _head(0x60, len(data))
        out += data
    elif isinstance(value, tuple | list):
        out += _head(0x80, len(value))
        for item in value:
            _encode(item, out)
    else:
        raise TypeError(f"cannot CBOR-encode {type(value).__name__}")


def cbor_encode(value: CBORValue) -> bytes:
    """Canonical CBOR (RFC 8949) of ``None``, integers in ``(-2**64, 2**64)``, byte and
    text strings, and tuples or lists of these (as arrays): the bytes ``cbor2.dumps(value,
    canonical=True)`` gives, for the value shapes vLLM hashes. Raises ``TypeError`` for
    any other type and ``ValueError`` for an integer out of range."""
    out = bytearray()
    _encode(value, out)
    return bytes(out)


def vllm_none_hash(seed: str | None) -> BlockHash:
    """vLLM's ``NONE_HASH``, the parent of every first block: ``sha256_cbor(seed)``, with
    ``seed`` in ``PYTHONHASHSEED``'s role (``None``: vLLM's default seed)."""
    return hashlib.sha256(cbor_encode(VLLM_DEFAULT_SEED if seed is None else seed)).digest()


def vllm_block_hash(parent: BlockHash, tokens: Sequence[int]) -> BlockHash:
    """vLLM's ``hash_block_tokens(sha256_cbor, parent, tokens, None)``: the block of a
    plain-text request (no extra keys) whose preceding block hashed to ``parent``."""
    return hashlib.sha256(cbor_encode((parent, tuple(tokens), None))).digest()


@dataclass(frozen=True, slots=True)
class PrefixHasher:
    """One hash scheme with its root: ``block_hash(parent, tokens)`` hashes a full block
    after a block that hashed to ``parent``; ``root`` is a first block's parent."""

    root: BlockHash
    block_hash: Callable[[BlockHash, Sequence[int]], BlockHash]

    def prefix_hashes(self, token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
        """Hashes of every full block of ``token_ids``, first block first."""
        hashes = []
        parent = self.root
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            parent = self.block_hash(parent, token_ids[start : start + block_size])
            hashes.append(parent)
        return hashes


# The schemes by the name ``cache.prefix_hash`` gives (``config.PrefixHashName``; a unit
# test checks the two agree). Each builds its hasher from ``cache.prefix_hash_seed``.
PREFIX_HASH_SCHEMES: dict[str, Callable[[str | None], PrefixHasher]] = {
    "orchestrator": lambda seed: PrefixHasher(root_hash(seed), block_hash),
    "vllm_sha256_cbor": lambda seed: PrefixHasher(vllm_none_hash(seed), vllm_block_hash),
}


def prefix_hasher(scheme: str, seed: str | None) -> PrefixHasher:
    """The hasher of the scheme named ``scheme`` (a key of ``PREFIX_HASH_SCHEMES``;
    ``ValueError`` names the known ones otherwise), seeded with ``seed``."""
    try:
        make = PREFIX_HASH_SCHEMES[scheme]
    except KeyError:
        known = ", ".join(PREFIX_HASH_SCHEMES)
        raise ValueError(f"unknown prefix hash scheme {scheme!r}; known: {known}") from None
    return make(seed)
