"""The scheduler factory: what runs once per ``PyExecutor`` TensorRT-LLM builds, in the
process that builds it (the serving process on one rank, each rank's worker process on
more).

It builds a fresh ``in_loop_engine`` from the engine config over that executor's KV
pool (``get_kv_cache_stats()``), on the wall clock (``time.monotonic``, the serving
engine's clock too, so submitted arrival times and deadlines mean the same on one
host). With more than one tensor-parallel rank the adapter shares rank 0's decision
(``ranks.DistLink`` over the executor's ``dist``); only rank 0 reads facts and reports
refusals (a follower applies rank 0's decision and needs neither).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from orchestrator.core import WallClock
from plugins.trtllm.errors import TrtllmError
from plugins.trtllm.in_executor.adapter import CoreRequestScheduler, KvSource, in_loop_engine
from plugins.trtllm.in_executor.facts import FactsSource
from plugins.trtllm.in_executor.install import Release, SchedulerFactory, kv_cache_manager
from plugins.trtllm.in_executor.ranks import DistLink
from plugins.trtllm.in_executor.refusals import RefusalSink
from plugins.trtllm.in_executor.settings import InExecutorCore

logger = logging.getLogger(__name__)

Channels = Callable[[], tuple[FactsSource | None, RefusalSink | None]]
"""Opens rank 0's facts source and refusal sink (called on rank 0 only, once per
executor built)."""


def executor_rank(py_executor: Any) -> tuple[int, int]:
    """``(tp_size, rank)`` of the executor's ``dist``: TensorRT-LLM's ``Distributed``
    (``tensorrt_llm/_torch/distributed/communicator.py`` at ``a1cf28f9``) has
    ``tp_size`` and ``rank`` (the global rank, ``mapping.rank``) as properties. Its
    ``broadcast(obj, root=0)`` runs over the whole world communicator, so ``root=0`` is
    global rank 0; with one pipeline and context rank and no attention DP (refused by
    ``install.check_executor``) the world is the tensor-parallel group and ``rank`` is
    ``tp_rank``."""
    dist = getattr(py_executor, "dist", None)
    tp_size = int(getattr(dist, "tp_size", 1))
    return tp_size, int(getattr(dist, "rank", 0)) if tp_size > 1 else 0


def lift_pause_cap(py_executor: Any, max_model_len: int) -> None:
    """Make TensorRT-LLM's pause keep every token of a request the core preempts.

    ``PyExecutor._pause_requests`` calls ``req.pause(self.max_input_len)``, which cuts a
    request's prompt plus generated tokens to that length (C++ ``LlmRequest::pause``);
    on the 1.2-era code ``max_input_len`` is ``PyExecutor.__init__``'s default, 2048,
    because ``create_py_executor_instance`` never passes one (``py_executor.py`` at
    ``9521caf4``; ``_util.py``, stored copies). A longer request would resume on a
    truncated context. The attribute is read at each pause, so it is raised here to the
    core's context limit (``max_model_len``, tokens), the longest any request can be.
    Newer code pauses for recompute with ``_UNBOUNDED_PAUSE_MAX_INPUT_LEN`` (0x7fffffff)
    and no longer reads it there (``py_executor.py`` at ``0004396``), so raising it
    changes nothing on those."""
    cap = getattr(py_executor, "max_input_len", None)
    if isinstance(cap, int) and cap < max_model_len:
        logger.info(
            "in-executor scheduling: TensorRT-LLM's pause cap (max_input_len) raised from "
            "%d to %d tokens, so a paused request keeps its whole context",
            cap,
            max_model_len,
        )
        py_executor.max_input_len = max_model_len


def scheduler_factory(
    core: InExecutorCore,
    tokens_per_block: int,
    built: list[CoreRequestScheduler],
    channels: Channels,
) -> SchedulerFactory:
    """The factory ``install`` runs for each executor: appends every adapter it builds
    to ``built`` (the latest is the serving one)."""

    def factory(py_executor: Any, release: Release) -> CoreRequestScheduler:
        kv = kv_cache_manager(py_executor, release)
        stats = kv.get_kv_cache_stats()
        if int(stats.tokens_per_block) != tokens_per_block:
            raise TrtllmError(
                f"TensorRT-LLM's KV blocks hold {stats.tokens_per_block} tokens, the "
                f"scheduler's {tokens_per_block}"
            )
        lift_pause_cap(py_executor, core.max_model_len)
        tp_size, rank = executor_rank(py_executor)
        link = DistLink(py_executor.dist, rank) if tp_size > 1 else None
        facts, refusals = channels() if rank == 0 else (None, None)
        engine = in_loop_engine(
            core.engine, int(stats.max_num_blocks), core.max_model_len, WallClock()
        )
        adapter = release.scheduler_class(
            engine, release.types, KvSource(kv), facts=facts, refusals=refusals, link=link
        )
        built.append(adapter)
        logger.info(
            "in-executor scheduling: our scheduler runs TensorRT-LLM %s's iterations over "
            "%d KV blocks of %d tokens (rank %d of %d%s)",
            release.version,
            int(stats.max_num_blocks),
            tokens_per_block,
            rank,
            tp_size,
            ", deciding" if rank == 0 else ", following rank 0",
        )
        return adapter

    return factory
