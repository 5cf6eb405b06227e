"""The torch executor's KV pool size: as configured, or ``auto`` from the scheduler's
largest possible demand within a share of the memory available (``kv_size.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.torch_executor.kv_size import (
    AUTO_MEMORY_SHARE,
    available_cpu_memory_bytes,
    kv_pool_size,
)

GIB = 2**30


def size(kv_cache_gib: float | None, available: int | None, per_block: int = 2**20) -> int:
    return kv_pool_size(
        kv_cache_gib=kv_cache_gib,
        bytes_per_block=per_block,
        block_size=16,
        max_batch_size=64,
        max_model_len=2000,
        available_bytes=available,
    ).num_blocks


def test_a_configured_size_is_taken_as_it_is() -> None:
    assert size(0.5, available=None) == 512
    assert size(0.5, available=1) == 512  # an explicit size is the operator's call


def test_auto_holds_a_full_batch_of_the_longest_sequences() -> None:
    # 64 sequences of 2000 tokens: 125 blocks of 16 each.
    assert size(None, available=100 * GIB) == 64 * 125
    assert size(None, available=None) == 64 * 125


def test_auto_is_capped_by_the_memory_available_and_says_so() -> None:
    pool = kv_pool_size(
        kv_cache_gib=None,
        bytes_per_block=2**20,
        block_size=16,
        max_batch_size=64,
        max_model_len=2000,
        available_bytes=4 * GIB,
    )
    assert pool.num_blocks == int(4 * GIB * AUTO_MEMORY_SHARE) // 2**20
    assert "capped at 50% of the 4.0 GiB available" in pool.reason


def test_no_block_is_an_error_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"holds no block of 16 tokens.*executor\.kv_cache_gib"):
        size(None, available=2**10)


def test_available_memory_is_the_smaller_of_the_kernels_and_the_cgroups(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 24000000 kB\nMemAvailable: 20000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert available_cpu_memory_bytes(meminfo, cgroup) == 20000000 * 1024
    (cgroup / "memory.max").write_text("max\n")  # v2 without a limit
    (cgroup / "memory.current").write_text("1000\n")
    assert available_cpu_memory_bytes(meminfo, cgroup) == 20000000 * 1024
    (cgroup / "memory.max").write_text(f"{8 * GIB}\n")
    (cgroup / "memory.current").write_text(f"{3 * GIB}\n")
    assert available_cpu_memory_bytes(meminfo, cgroup) == 5 * GIB
    assert available_cpu_memory_bytes(tmp_path / "none", tmp_path / "none") is None


def test_this_machine_reports_some_memory() -> None:
    available = available_cpu_memory_bytes()
    if available is None:
        pytest.skip("neither /proc/meminfo nor a cgroup reports memory here")
    assert available > 0
