"""TensorRT-LLM's KV cache as its iteration statistics report it, in both modes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KvSnapshot:
    """TensorRT-LLM's KV cache as its iteration statistics last reported it: blocks of
    ``tokens_per_block`` tokens; ``at_s`` is when it was read (``time.monotonic``)."""

    max_blocks: int
    free_blocks: int
    used_blocks: int
    tokens_per_block: int
    at_s: float
