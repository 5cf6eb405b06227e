"""Start-up of in-executor scheduling in the serving process: check the release, put
the scheduler factory where TensorRT-LLM builds its executors, and hand the submitting
side its facts channel and refusal channel.

``start`` runs before ``tensorrt_llm.LLM`` is built (the executor is built inside it).
On one tensor-parallel rank TensorRT-LLM's worker runs in this process and the factory
(``factory.scheduler_factory``) is installed here, with in-process channels. On more,
every rank runs in an MPI worker process: ``workers.reach_workers`` makes each worker
install the factory itself, and this process hosts the socket rank 0 connects to
(``channel.ChannelHost``); after the LLM is built, ``check_started`` confirms that rank
0's scheduler connected.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugins.trtllm.errors import TrtllmError
from plugins.trtllm.in_executor.adapter import CoreRequestScheduler
from plugins.trtllm.in_executor.channel import ChannelHost
from plugins.trtllm.in_executor.factory import scheduler_factory
from plugins.trtllm.in_executor.facts import FactsChannel, FactsSubmitter
from plugins.trtllm.in_executor.install import (
    CHECKED_RELEASES,
    OVERLAP_OPTION,
    Release,
    install,
    load_release,
)
from plugins.trtllm.in_executor.refusals import RefusalChannel
from plugins.trtllm.in_executor.settings import InExecutorCore
from plugins.trtllm.in_executor.workers import WorkerSetup, reach_workers

# Options the LLM is built with in this mode (TorchLlmArgs fields; listed in
# plugins.trtllm.names' in-executor block): the overlap scheduler off (install.py says why).
LLM_OPTIONS: dict[str, Any] = {OVERLAP_OPTION: True}
# How long to wait, once the LLM is built, for rank 0's scheduler to connect (seconds):
# the LLM returns after its workers built their executors (the READY signal follows
# executor creation, worker.py), so the connection is normally already there.
CONNECT_WAIT_S = 10.0


@dataclass
class InExecutor:
    """A started in-executor mode: the release, the facts channel the submitting side
    writes, the refusal channel it listens to, the schedulers built in this process so
    far (the latest is the serving one; none on more than one rank, where they live in
    the workers), the undo, and the socket host on more than one rank."""

    release: Release
    facts: FactsSubmitter
    refusals: RefusalChannel
    schedulers: list[CoreRequestScheduler]
    undo: Callable[[], None]
    host: ChannelHost | None = None

    def check_started(self, timeout_s: float = CONNECT_WAIT_S) -> None:
        """After the LLM is built: ``TrtllmError`` if our scheduler is not running in
        it (no scheduler built here, or rank 0's worker never connected)."""
        if self.host is None:
            if not self.schedulers:
                raise TrtllmError(
                    "scheduling: in_executor: TensorRT-LLM built its executor without our "
                    "scheduler; remove executor.scheduling"
                )
            return
        if not self.host.wait_connected(timeout_s):
            raise TrtllmError(
                "scheduling: in_executor: rank 0's scheduler did not connect within "
                f"{timeout_s:g} s: TensorRT-LLM's workers were not started through "
                "tensorrt_llm.executor.proxy.worker_main (the RPC and Ray orchestrators "
                "are not reached); remove executor.scheduling"
            )

    def shutdown(self) -> None:
        """Restore TensorRT-LLM's own entry points and close the channel (call after
        the LLM shut down)."""
        self.undo()
        if self.host is not None:
            self.host.close()


def start(
    core: InExecutorCore,
    tokens_per_block: int,
    import_module: Callable[[str], Any] = importlib.import_module,
) -> InExecutor:
    """Check the installed release (``TrtllmError`` naming the checked range otherwise)
    and install the factory, in this process or the workers by
    ``core.tensor_parallel_size``; ``import_module`` replaces
    ``importlib.import_module`` in tests."""
    try:
        release = load_release(import_module)
    except ImportError as err:
        raise TrtllmError(
            f"scheduling: in_executor needs TensorRT-LLM {CHECKED_RELEASES} with its "
            f"PyTorch backend ({err})"
        ) from err
    built: list[CoreRequestScheduler] = []
    if core.tensor_parallel_size <= 1:
        facts, refusals = FactsChannel(), RefusalChannel()
        factory = scheduler_factory(core, tokens_per_block, built, lambda: (facts, refusals))
        return InExecutor(release, facts, refusals, built, install(release, factory))
    host = ChannelHost()
    try:
        setup = WorkerSetup(core, tokens_per_block, host.address, import_module=import_module)
        undo = reach_workers(setup, import_module)
    except BaseException:
        host.close()
        raise
    return InExecutor(release, host, host.refusals, built, undo, host)
