"""How large the paged KV pool is: ``kv_cache_gib`` as configured, or with ``auto`` the
most the scheduler can ever hold, within a share of the memory this process can use.

``auto`` asks for ``max_batch_size`` sequences of ``max_model_len`` tokens, whole blocks
each: beyond that no schedule could use a block (bar the prefix cache's leftovers), and
short of it a full batch of long requests waits for blocks or is preempted. The request is
capped at ``AUTO_MEMORY_SHARE`` of the memory available when the executor starts: on CPU
the smaller of the kernel's ``MemAvailable`` and what the cgroup (a container's memory
limit) has left; on CUDA the device's free memory. Both are read on the machine that
runs, so no size measured elsewhere ships as a default. Imports nothing heavy: the caller
passes the byte counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

# The share of available memory ``auto`` may take: the rest is for the weights' working
# copies, activations, the gateway and whatever else shares the machine.
AUTO_MEMORY_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class KvPoolSize:
    """The pool's size in blocks and why: ``reason`` is one line for the start-up log."""

    num_blocks: int
    reason: str


def available_cpu_memory_bytes(
    meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Bytes this process can still allocate on CPU: ``MemAvailable``, or less where a
    cgroup v2 (``memory.max`` less ``memory.current``) or v1 (``memory/memory.limit_in_bytes``
    less ``memory/memory.usage_in_bytes``) limit leaves less; ``None`` where neither the
    kernel nor a cgroup says."""
    candidates = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append(int(line.split()[1]) * 1024)  # kB
                break
    except OSError:
        pass
    for limit_file, usage_file in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            limit = (cgroup / limit_file).read_text().strip()
            usage = int((cgroup / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit():  # "max" (v2) means no limit; v1 writes a huge number instead
            candidates.append(max(0, int(limit) - usage))
    return min(candidates) if candidates else None


def kv_pool_size(
    *,
    kv_cache_gib: float | None,
    bytes_per_block: int,
    block_size: int,
    max_batch_size: int,
    max_model_len: int,
    available_bytes: int | None,
) -> KvPoolSize:
    """The pool for ``kv_cache_gib`` GiB, or (``None``: ``auto``) for ``max_batch_size``
    sequences of ``max_model_len`` tokens within ``AUTO_MEMORY_SHARE`` of
    ``available_bytes``. Raises ``ValueError`` when not one block fits."""
    if kv_cache_gib is not None:
        num_blocks = int(kv_cache_gib * 2**30) // bytes_per_block
        reason = f"kv_cache_gib {kv_cache_gib:g}"
    else:
        wanted = max_batch_size * math.ceil(max_model_len / block_size)
        reason = f"auto: {max_batch_size} sequences x {max_model_len} tokens"
        num_blocks = wanted
        if available_bytes is not None:
            cap = int(available_bytes * AUTO_MEMORY_SHARE) // bytes_per_block
            if cap < wanted:
                num_blocks = cap
                reason += (
                    f" would need {wanted * bytes_per_block / 2**30:.2f} GiB; capped at "
                    f"{AUTO_MEMORY_SHARE:.0%} of the {available_bytes / 2**30:.1f} GiB available"
                )
    if num_blocks < 1:
        raise ValueError(
            f"the KV pool ({reason}) holds no block of {block_size} tokens "
            f"({bytes_per_block} bytes each); set executor.kv_cache_gib"
        )
    gib = num_blocks * bytes_per_block / 2**30
    return KvPoolSize(
        num_blocks, f"{num_blocks} blocks of {block_size} tokens, {gib:.2f} GiB ({reason})"
    )
