"""Our engine's KV events forwarded to Dynamo's ``KvEventPublisher``, which feeds the
frontend's KV router.

Dynamo's router keys its index by its own hash of each block's token ids (it hashes
the ``token_ids`` of a stored event itself, ``kv_block_size`` tokens per block), so the
tokens must come whole and the block size must be the one the worker registered
(``cache.block_size``: the ``Worker`` builds the publisher with the registration's
``kv_cache_block_size``, and the frontend's ``--kv-cache-block-size`` must be left
unset or equal). Our block hashes only name blocks between a stored event and its
removal: Dynamo wants signed 64-bit integers, so each 32-byte digest becomes its first
8 bytes, little-endian, signed (a collision within one worker's live blocks is a 2^-64
event per pair). Dynamo has no "all cleared" event: the sink remembers which hashes it
published and removes them all.

``KVEventSink.publish`` runs on the engine's step thread and must not block or raise:
the publisher's calls only enqueue (``dynamo/_core.pyi``, ``KvEventPublisher``), and a
failure is logged and the events dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from orchestrator.core import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

logger = logging.getLogger(__name__)


class Publisher(Protocol):
    """The part of ``dynamo.llm.KvEventPublisher`` the sink calls (``_core.pyi``)."""

    def publish_stored(
        self,
        token_ids: list[int],
        num_block_tokens: list[int],
        block_hashes: list[int],
        parent_hash: int | None = None,
    ) -> None: ...

    def publish_removed(self, block_hashes: list[int]) -> None: ...


def dynamo_hash(digest: bytes) -> int:
    """Our block hash as Dynamo's external block hash: a signed 64-bit integer."""
    return int.from_bytes(digest[:8], "little", signed=True)


class DynamoKVEventSink:
    """A ``KVEventSink`` that forwards to a Dynamo publisher from ``connect()`` until
    ``close()``. The sink is attached when the engine is built and the publisher arrives
    later (Dynamo hands it over once the worker registered); events before it are
    dropped (none: no request has run by then)."""

    def __init__(self) -> None:
        self._publisher: Publisher | None = None
        self._lock = threading.Lock()  # publish (engine thread) against connect/close
        self._closed = False
        # Hashes published as stored and not yet removed: what "all cleared" removes.
        self._live: set[int] = set()

    def connect(self, publisher: Publisher) -> None:
        """Forward to ``publisher`` from now on (``PushSource.on_ready``)."""
        with self._lock:
            self._publisher = publisher

    def publish(self, events: Sequence[KVEvent]) -> None:
        with self._lock:
            if self._closed or self._publisher is None:
                return
            for event in events:
                try:
                    self._forward(event)
                except Exception:
                    logger.exception("dropped a KV event the Dynamo publisher refused")

    def _forward(self, event: KVEvent) -> None:
        assert self._publisher is not None
        if isinstance(event, BlockStored):
            hashes = [dynamo_hash(h) for h in event.block_hashes]
            parent = (
                None if event.parent_block_hash is None else dynamo_hash(event.parent_block_hash)
            )
            self._publisher.publish_stored(
                token_ids=list(event.token_ids),
                num_block_tokens=[event.block_size] * len(hashes),
                block_hashes=hashes,
                parent_hash=parent,
            )
            self._live.update(hashes)
        elif isinstance(event, BlockRemoved):
            hashes = [dynamo_hash(h) for h in event.block_hashes]
            self._publisher.publish_removed(block_hashes=hashes)
            self._live.difference_update(hashes)
        elif isinstance(event, AllBlocksCleared):
            if self._live:
                self._publisher.publish_removed(block_hashes=sorted(self._live))
            self._live.clear()

    def close(self) -> None:
        """Publish nothing more: Dynamo's publisher goes away with the worker (called
        when the worker's cleanup begins, and again by the engine's shutdown)."""
        with self._lock:
            self._closed = True
