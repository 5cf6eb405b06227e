"""KV cache events: which prefix-cache blocks a replica stored and removed, as plain data.

A KV-aware router (NVIDIA Dynamo's, llm-d's precise prefix-cache scorer) keeps an index
of the blocks each replica holds and sends a request where most of its prompt is
already cached. It learns the index from these events. The core emits them through an
optional ``KVEventSink``; the plug-ins translate them for each engine (Dynamo's
``KvEventPublisher``, vLLM's ZMQ wire format). With no sink attached nothing is
recorded, so the events cost nothing.

Hashes are the KV manager's own block hashes (``orchestrator.core.kv.hashing``): raw
digests, in the scheme the cache config selects; a publisher converts them to its
engine's external form.

The events replay the prefix cache exactly: applying them in order (``BlockStored`` adds
its hashes, ``BlockRemoved`` drops its hashes, ``AllBlocksCleared`` drops all) gives the
set of hashes the KV manager holds. A hash is stored once while it stays cached (a second
request that computed the same block adds no event), and removed once when it is
evicted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.core.kv.hashing import BlockHash


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Consecutive full blocks that became reusable prefix-cache entries.

    ``block_hashes[i]`` covers ``token_ids[i * block_size:(i + 1) * block_size]``;
    ``parent_block_hash`` is the hash of the block just before the first one (``None``
    when the first is a sequence's first block)."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks whose prefix-cache entries were evicted (their memory was reused)."""

    block_hashes: tuple[BlockHash, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every prefix-cache entry of this replica was dropped."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventSink(Protocol):
    """Receives a replica's KV events in the order they happened.

    ``publish`` is called on the engine's thread, once per engine step that produced
    events, with those events (a new list each time: the sink may keep it); it must not
    block (hand them to another thread or a non-blocking socket) and must not raise: a
    sink that cannot deliver drops and logs (the engine also logs and carries on if one
    raises). ``close`` is called once, by whoever owns the sink (the engine, for a sink
    attached with ``EngineCore.attach_kv_event_sink``), after the last ``publish``: it
    delivers what it can within a bounded time (seconds) and releases the sink's
    resources.
    """

    def publish(self, events: Sequence[KVEvent]) -> None: ...

    def close(self) -> None: ...
