"""Prefix-cache block hashes: SHA-256 chained over token bytes, seeded; and the KV
manager's admission headroom."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

import pytest

from orchestrator.core.kv.hashing import block_hash, prefix_hashes, root_hash
from orchestrator.core.kv.manager import KVCacheManager
from tests.factories import make_request

TOKENS = list(range(100, 164))


def test_a_block_hash_is_sha256_of_the_parent_digest_and_the_tokens_as_uint32() -> None:
    parent = root_hash("seed")
    expected = hashlib.sha256(parent + struct.pack("<4I", 1, 2, 3, 70000)).digest()
    assert block_hash(parent, [1, 2, 3, 70000]) == expected
    assert parent == hashlib.sha256(b"orchestrator-prefix-v1\x00seed").digest()


def test_hashes_chain_so_equal_blocks_after_different_prefixes_differ() -> None:
    root = root_hash("seed")
    a = prefix_hashes(root, [1] * 16 + [5] * 16, 16)
    b = prefix_hashes(root, [2] * 16 + [5] * 16, 16)
    assert len(a) == 2 and a[1] != b[1]
    assert prefix_hashes(root, [*TOKENS, 9], 16) == prefix_hashes(root, TOKENS, 16)


def _hashes_in_fresh_process(seed: str | None) -> str:
    code = (
        "from orchestrator.core.kv.hashing import prefix_hashes, root_hash\n"
        f"print(prefix_hashes(root_hash({seed!r}), list(range(100, 164)), 16)[-1].hex())"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_seed_gives_the_same_hashes_in_every_process_and_none_a_secret_one() -> None:
    here = prefix_hashes(root_hash("replicas"), TOKENS, 16)[-1].hex()
    assert _hashes_in_fresh_process("replicas") == here
    unseeded = {_hashes_in_fresh_process(None), _hashes_in_fresh_process(None)}
    assert len(unseeded) == 2 and here not in unseeded


def test_out_of_range_token_ids_are_refused_with_the_id() -> None:
    with pytest.raises(ValueError, match="token id -1"):
        block_hash(root_hash("s"), [1, -1])


def test_the_prefix_cache_finds_blocks_by_content_across_requests() -> None:
    kv = KVCacheManager(16, 4, hash_seed="s")
    first = make_request(prompt=list(range(12)), request_id="first")
    assert kv.allocate(first, 12) is not None
    first.num_computed_tokens = 12
    kv.commit(first)
    kv.free(first)
    again = make_request(prompt=[*range(12), 99], request_id="again")
    assert len(kv.find_cached_prefix(again)) == 3
    kv.integrity_check()


def test_admission_headroom_keeps_blocks_free_per_running_request() -> None:
    kv = KVCacheManager(10, 4, headroom_blocks=2)
    assert kv.can_admit(6, num_running=2)  # 6 + 2 x 2 = 10 free
    assert not kv.can_admit(7, num_running=2)
    assert KVCacheManager(10, 4, headroom_blocks=0).can_admit(10, num_running=5)
