"""Start-up of in-executor scheduling in the serving process: check the release, install
the scheduler factory, and hand the submitting side the facts channel.

``start`` runs before ``tensorrt_llm.LLM`` is built (the worker is built inside it). The
factory runs in the worker, once per ``PyExecutor`` TensorRT-LLM builds: it builds a
fresh ``in_loop_engine`` from the engine config over that executor's KV pool
(``get_kv_cache_stats()``), on the wall clock (``time.monotonic``, the serving engine's
clock too, so submitted arrival times and deadlines mean the same).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.core import WallClock
from plugins.trtllm.errors import TrtllmError
from plugins.trtllm.in_executor.adapter import CoreRequestScheduler, KvSource, in_loop_engine
from plugins.trtllm.in_executor.facts import FactsChannel
from plugins.trtllm.in_executor.install import (
    CHECKED_RELEASES,
    OVERLAP_OPTION,
    Release,
    install,
    kv_cache_manager,
    load_release,
)
from plugins.trtllm.in_executor.refusals import RefusalChannel
from plugins.trtllm.llm_api.settings import InExecutorCore

logger = logging.getLogger(__name__)

# Options the LLM is built with in this mode (TorchLlmArgs fields; listed in
# plugins.trtllm.names' in-executor block): the overlap scheduler off (install.py says why).
LLM_OPTIONS: dict[str, Any] = {OVERLAP_OPTION: True}


@dataclass
class InExecutor:
    """A started in-executor mode: the release, the facts channel the submitting side
    writes, the refusal channel it listens to, the schedulers built so far (the latest
    is the serving one) and the undo."""

    release: Release
    facts: FactsChannel
    refusals: RefusalChannel
    schedulers: list[CoreRequestScheduler]
    undo: Callable[[], None]

    def shutdown(self) -> None:
        """Restore TensorRT-LLM's own factory (call after the LLM shut down)."""
        self.undo()


def start(
    core: InExecutorCore,
    tokens_per_block: int,
    import_module: Callable[[str], Any] = importlib.import_module,
) -> InExecutor:
    """Check the installed release (``TrtllmError`` naming the checked range otherwise)
    and install the factory; ``import_module`` replaces ``importlib.import_module`` in
    tests."""
    try:
        release = load_release(import_module)
    except ImportError as err:
        raise TrtllmError(
            f"scheduling: in_executor needs TensorRT-LLM {CHECKED_RELEASES} with its "
            f"PyTorch backend ({err})"
        ) from err
    facts, refusals = FactsChannel(), RefusalChannel()
    built: list[CoreRequestScheduler] = []

    def factory(py_executor: Any, rel: Release) -> CoreRequestScheduler:
        kv = kv_cache_manager(py_executor, rel)
        stats = kv.get_kv_cache_stats()
        if int(stats.tokens_per_block) != tokens_per_block:
            raise TrtllmError(
                f"TensorRT-LLM's KV blocks hold {stats.tokens_per_block} tokens, the "
                f"scheduler's {tokens_per_block}"
            )
        engine = in_loop_engine(
            core.engine, int(stats.max_num_blocks), core.max_model_len, WallClock()
        )
        adapter = CoreRequestScheduler(
            engine, rel.types, KvSource(kv), facts=facts, refusals=refusals
        )
        built.append(adapter)
        logger.info(
            "in-executor scheduling: our scheduler runs TensorRT-LLM %s's iterations over "
            "%d KV blocks of %d tokens",
            rel.version,
            int(stats.max_num_blocks),
            tokens_per_block,
        )
        return adapter

    return InExecutor(release, facts, refusals, built, install(release, factory))
