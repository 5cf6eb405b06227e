"""Reaching TensorRT-LLM's MPI worker processes (more than one tensor-parallel rank).

With ``tensor_parallel_size`` above 1 the LLM API runs no rank in the serving process:
``GenerationExecutor.create`` (``tensorrt_llm/executor/executor.py`` at ``ed53795b``)
picks ``_create_ipc_executor(use_worker=False)`` when workers must be spawned
(``need_spawn_mpi_workers``) or an external MPI communicator is reused, and
``GenerationExecutorProxy._start_executor_workers`` (``tensorrt_llm/executor/proxy.py``
at ``b93e14ca``; ``ExecutorBindingsProxy`` in the older copy at ``005bc848``, same call)
runs ``self.mpi_session.submit(worker_main, **worker_kwargs, worker_cls=...,
tracer_init_kwargs=..., _torch_model_class_mapping=..., ready_signal=...)``, where
``worker_main`` is the proxy module's global, imported by ``from .worker import (...,
worker_main)``. ``MpiPoolSession.submit`` hands it to ``MPIPoolExecutor.submit`` once
per rank (``tensorrt_llm/llmapi/mpi_session.py`` at ``cc4777e9``; the pool is started
with ``path=sys.path``, so a worker imports what the serving process can); mpi4py
pickles the function by reference (module and name), so each worker imports the module
the function lives in.

``reach_workers`` therefore replaces ``proxy.worker_main`` with
``functools.partial(worker_main, setup)``, this module's ``worker_main`` bound to a
picklable ``WorkerSetup``. In each worker it installs the scheduler factory in that
process (``install(..., single_process=False)``), connects rank 0 to the serving
process's channel (``channel.WorkerLink``, opened by the factory), then calls
TensorRT-LLM's own ``tensorrt_llm.executor.worker.worker_main`` (worker.py at
``cc4777e9``; keyword arguments only) with the same arguments, which builds the
``PyExecutor`` through the wrapped factory and serves until shutdown. Under
``MpiCommSession`` (an ``mpirun`` launch) rank 0's task runs on a thread of the serving
process itself; the install is the same there.

Not reached: the RPC and Ray orchestrators (``orchestrator_type`` ``rpc``/``ray``),
which submit other entry points; the executor checks after the LLM is built that rank
0's scheduler connected and refuses to start otherwise.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugins.trtllm.errors import TrtllmError
from plugins.trtllm.in_executor.adapter import CoreRequestScheduler
from plugins.trtllm.in_executor.channel import FACTS_WAIT_S, ChannelAddress, WorkerLink
from plugins.trtllm.in_executor.factory import scheduler_factory
from plugins.trtllm.in_executor.facts import FactsSource
from plugins.trtllm.in_executor.install import install, load_release
from plugins.trtllm.in_executor.refusals import RefusalSink
from plugins.trtllm.in_executor.settings import InExecutorCore
from plugins.trtllm.names import (
    IN_EXECUTOR_PROXY_MODULE,
    IN_EXECUTOR_WORKER_MAIN,
    IN_EXECUTOR_WORKER_MODULE,
)


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker process needs to build our scheduler (pickled to every rank):
    the core's config, the KV block size (tokens), the serving process's channel,
    how long rank 0 holds a request whose facts have not arrived (seconds), and the
    importer of TensorRT-LLM's modules (``importlib.import_module``; tests replace it
    with a module-level function, so it pickles by reference too)."""

    core: InExecutorCore
    tokens_per_block: int
    channel: ChannelAddress
    facts_wait_s: float = FACTS_WAIT_S
    import_module: Callable[[str], Any] = importlib.import_module


def worker_main(setup: WorkerSetup, *args: Any, **kwargs: Any) -> Any:
    """In a rank's worker process, in place of TensorRT-LLM's ``worker_main``: install
    the scheduler factory here, run the original with the same arguments, then undo
    the install and close rank 0's channel (the worker has shut down)."""
    release = load_release(setup.import_module)
    links: list[WorkerLink] = []

    def channels() -> tuple[FactsSource | None, RefusalSink | None]:
        link = WorkerLink(setup.channel, 0, setup.facts_wait_s)
        links.append(link)
        return link, link

    built: list[CoreRequestScheduler] = []
    factory = scheduler_factory(setup.core, setup.tokens_per_block, built, channels)
    undo = install(release, factory, single_process=False)
    try:
        original = getattr(setup.import_module(IN_EXECUTOR_WORKER_MODULE), IN_EXECUTOR_WORKER_MAIN)
        return original(*args, **kwargs)
    finally:
        undo()
        for link in links:
            link.close()


def reach_workers(
    setup: WorkerSetup, import_module: Callable[[str], Any] = importlib.import_module
) -> Callable[[], None]:
    """Make the proxy submit ``worker_main`` bound to ``setup`` to every rank; returns
    the undo. Raises ``TrtllmError`` if it is already in place in this process."""
    proxy = import_module(IN_EXECUTOR_PROXY_MODULE)
    original = getattr(proxy, IN_EXECUTOR_WORKER_MAIN)
    if isinstance(original, functools.partial) and original.func is worker_main:
        raise TrtllmError("the in-executor scheduler already reaches the workers")
    setattr(proxy, IN_EXECUTOR_WORKER_MAIN, functools.partial(worker_main, setup))

    def undo() -> None:
        setattr(proxy, IN_EXECUTOR_WORKER_MAIN, original)

    return undo
