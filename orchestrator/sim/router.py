"""Routers: which replica an arriving request goes to.

Three policies, registered by name in ``ROUTERS``:

- ``round_robin``: each replica in turn, blind to load and content.
- ``least_outstanding_tokens``: the replica with the least work left.
- ``prefix_aware``: the scoring of llm-d's endpoint picker (the Gateway API Inference
  Extension EPP): a weighted sum of a prefix-cache score, a queue score and a
  KV-utilisation score, highest wins. The prefix score comes from an approximate index
  of which replica recently served which prompt blocks, as the EPP's
  ``prefix-cache-scorer`` keeps it: the router never looks inside an engine's cache, it
  remembers where it sent each prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.core import BlockHash, prefix_hashes, root_hash


class Load(Protocol):
    """What a router may know about a replica: the gauges a replica's ``/metrics``
    exports, plus the driver's own count of work sent to it."""

    @property
    def outstanding_tokens(self) -> int:
        """Prompt tokens not yet prefilled plus output tokens not yet produced, over the
        requests routed to it and not finished."""
        ...

    @property
    def num_waiting(self) -> int:
        """Requests queued and not yet admitted (``orchestrator_num_requests_waiting``)."""
        ...

    @property
    def num_running(self) -> int:
        """Requests admitted and not finished (``orchestrator_num_requests_running``)."""
        ...

    @property
    def kv_usage(self) -> float:
        """Fraction in [0, 1] of KV blocks held by live requests
        (``orchestrator_kv_cache_usage_ratio``)."""
        ...


class Router(Protocol):
    """Picks a replica per request. ``choose`` is called once per arriving request, in
    arrival order, and the request is then sent to the replica it names: a router may
    record its own decision (the prefix-aware router does) but nothing else happens
    between two calls that it does not see through ``replicas``."""

    def choose(self, replicas: Sequence[Load], prompt_token_ids: Sequence[int]) -> int:
        """Index into ``replicas`` (non-empty) of the replica for this request."""
        ...


class RoundRobinRouter:
    """Each replica in turn, whatever its load."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, replicas: Sequence[Load], prompt_token_ids: Sequence[int]) -> int:
        index = self._next % len(replicas)
        self._next = index + 1
        return index


class LeastOutstandingTokensRouter:
    """The replica with the least work left, in tokens; ties go to the lowest index, so
    the choice is deterministic."""

    def choose(self, replicas: Sequence[Load], prompt_token_ids: Sequence[int]) -> int:
        return min(range(len(replicas)), key=lambda i: replicas[i].outstanding_tokens)


class PrefixIndex:
    """Which replicas recently received which prompt blocks: a per-replica LRU of block
    hashes (at most ``capacity`` entries each) and the reverse map from a hash to the
    replicas holding it, like the EPP prefix-cache scorer's indexer.

    It approximates each replica's prefix cache; it is never told what an engine
    actually evicted, only what it was sent, so ``capacity`` should be about the
    replica's KV pool in blocks: larger and the index remembers prefixes the engine has
    dropped, smaller and it forgets ones the engine still holds.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1 block, got {capacity}")
        self.capacity = capacity
        self._lru: dict[int, OrderedDict[BlockHash, None]] = {}
        self._holders: dict[BlockHash, set[int]] = {}

    def add(self, hashes: Sequence[BlockHash], replica: int) -> None:
        """Record that ``replica`` now holds these blocks (first block first)."""
        lru = self._lru.setdefault(replica, OrderedDict())
        # Added last block first, so a prompt's first blocks are its most recently used
        # and its tail is evicted first: the order in which an engine frees a request's
        # blocks (tail first), and the right one for prefixes, since a block is useless
        # once any block before it is gone.
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                self._holders.setdefault(h, set()).add(replica)
        while len(lru) > self.capacity:
            evicted, _ = lru.popitem(last=False)
            holders = self._holders[evicted]
            holders.discard(replica)
            if not holders:
                del self._holders[evicted]

    def longest_prefixes(self, hashes: Sequence[BlockHash]) -> dict[int, int]:
        """For each replica holding the first block, how many leading blocks of
        ``hashes`` it holds without a gap (replicas holding none are left out)."""
        matched: dict[int, int] = {}
        alive: set[int] | None = None
        for i, h in enumerate(hashes):
            holders = self._holders.get(h)
            if not holders:
                break
            alive = set(holders) if alive is None else alive & holders
            if not alive:
                break
            for replica in alive:
                matched[replica] = i + 1
        return matched

    def num_entries(self, replica: int) -> int:
        return len(self._lru.get(replica, ()))


@dataclass(frozen=True, slots=True)
class PrefixAwareWeights:
    """Weights of the three scores, each score in [0, 1]. The defaults are the EPP's
    default profile (queue 2, KV utilisation 2, prefix cache 3)."""

    prefix: float = 3.0
    queue: float = 2.0
    kv: float = 2.0

    def __post_init__(self) -> None:
        for name in ("prefix", "queue", "kv"):
            if getattr(self, name) < 0:
                raise ValueError(f"weight {name} must be >= 0, got {getattr(self, name)}")


class PrefixAwareRouter:
    """Prefix affinity balanced against load, scored as llm-d's endpoint picker does.

    For each replica, in [0, 1] each:

    - prefix score: leading full blocks of the prompt the replica is believed to hold,
      over the prompt's full blocks (at most ``max_prefix_blocks``); 0 for a prompt
      shorter than a block;
    - queue score: ``(max_q - q) / (max_q - min_q)`` over the replicas' waiting queues,
      1 for all when the queues are equal;
    - KV score: ``1 - kv_usage``.

    The replica with the highest weighted sum wins; ties go to the least outstanding
    tokens, then the lowest index, so a run is deterministic (the EPP breaks ties at
    random). The winner is recorded in the prefix index with the prompt's block hashes.

    Blocks are ``block_size`` tokens hashed with the project's seeded SHA-256 chain
    (``orchestrator.core.kv.hashing``), so equal prefixes give equal hashes. Unlike the
    EPP, which sees only text and guesses four characters a token, the simulator has the
    token ids, so blocks align with the engine's when ``block_size`` equals
    ``cache.block_size``. ``lru_capacity_per_replica`` is in blocks (see ``PrefixIndex``;
    the default is the EPP's).
    """

    def __init__(
        self,
        weights: PrefixAwareWeights | None = None,
        block_size: int = 16,
        max_prefix_blocks: int = 256,
        lru_capacity_per_replica: int = 31_250,
        seed: str = "orchestrator-router",
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1 token, got {block_size}")
        if max_prefix_blocks < 1:
            raise ValueError(f"max_prefix_blocks must be at least 1, got {max_prefix_blocks}")
        self.weights = weights or PrefixAwareWeights()
        self.block_size = block_size
        self.max_prefix_blocks = max_prefix_blocks
        self.index = PrefixIndex(lru_capacity_per_replica)
        self._root = root_hash(seed)

    def block_hashes(self, prompt_token_ids: Sequence[int]) -> list[BlockHash]:
        """Hashes of the prompt's leading full blocks, at most ``max_prefix_blocks``."""
        head = prompt_token_ids[: self.block_size * self.max_prefix_blocks]
        return prefix_hashes(self._root, head, self.block_size)

    def scores(
        self, replicas: Sequence[Load], hashes: Sequence[BlockHash]
    ) -> list[tuple[float, float, float]]:
        """(prefix, queue, KV) score of each replica for a prompt with these hashes."""
        matched = self.index.longest_prefixes(hashes) if hashes else {}
        queues = [r.num_waiting for r in replicas]
        lo, hi = min(queues), max(queues)
        out = []
        for i, replica in enumerate(replicas):
            prefix = matched.get(i, 0) / len(hashes) if hashes else 0.0
            queue = 1.0 if hi == lo else (hi - queues[i]) / (hi - lo)
            kv = 1.0 - min(max(replica.kv_usage, 0.0), 1.0)
            out.append((prefix, queue, kv))
        return out

    def choose(self, replicas: Sequence[Load], prompt_token_ids: Sequence[int]) -> int:
        hashes = self.block_hashes(prompt_token_ids)
        w = self.weights
        totals = [
            w.prefix * p + w.queue * q + w.kv * k for p, q, k in self.scores(replicas, hashes)
        ]
        best = min(
            range(len(replicas)),
            key=lambda i: (-totals[i], replicas[i].outstanding_tokens, i),
        )
        if hashes:
            self.index.add(hashes, best)
        return best


ROUTERS: dict[str, type[Router]] = {
    "round_robin": RoundRobinRouter,
    "least_outstanding_tokens": LeastOutstandingTokensRouter,
    "prefix_aware": PrefixAwareRouter,
}


def make_router(name: str) -> Router:
    """A fresh router of the registered ``name``, with its default settings; raises
    ``ValueError`` naming the known routers for any other name."""
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}") from None
