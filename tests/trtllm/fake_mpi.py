"""Fakes of what runs TensorRT-LLM's ranks in MPI worker processes, for the in-executor
scheduler on more than one tensor-parallel rank (tests/trtllm/test_in_executor_tp.py).

What each part reproduces (sources read on NVIDIA/TensorRT-LLM):

- ``FakeMpiPoolSession.submit(task, **kwargs)``: ``MpiPoolSession.submit``
  (``tensorrt_llm/llmapi/mpi_session.py`` at ``cc4777e9``) submits the task once per
  rank to ``MPIPoolExecutor``; mpi4py pickles the task and its arguments (stdlib
  ``pickle``: functions by module and name) and each worker is a separate interpreter
  that unpickles them, importing the task's module. Here: ``pickle.dumps`` of
  ``(task, kwargs)`` once, then one process per rank started with the ``spawn`` method
  (a fresh interpreter), which unpickles and calls it.
- ``PROXY.start_workers``: ``GenerationExecutorProxy._start_executor_workers``
  (``tensorrt_llm/executor/proxy.py`` at ``b93e14ca``) calls
  ``self.mpi_session.submit(worker_main, **worker_kwargs, ...)`` with ``worker_main``
  looked up in the proxy module's globals at call time; here ``PROXY.worker_main``.
- ``worker_main(**kwargs)`` (``WORKER.worker_main``): TensorRT-LLM's worker entry
  (``tensorrt_llm/executor/worker.py`` at ``cc4777e9``, keyword arguments only) builds
  the executor, through ``py_executor_creator.create_py_executor_instance`` (looked up
  on the module at call time, as ``create_py_executor`` does), on every rank; rank 0
  alone talks to the proxy's request queue. Here rank 0 drains ``requests`` (the
  serving process's submissions and cancellations) each iteration and broadcasts what it
  took to the other ranks, so every rank fetches the same requests in the same
  iteration, as ``ExecutorRequestQueue._broadcast_new_requests`` does without pipeline
  stages (``if not self.dist.has_pp: return self.dist.broadcast(payloads, root=0)``,
  ``tensorrt_llm/_torch/pyexecutor/executor_request_queue.py``, stored copies; the index
  exposes no commit): the same ``dist.broadcast`` our decision uses, called by every
  rank in the same order each iteration. Then it runs the
  loop of ``tests/trtllm/fake_pyexecutor.py`` until told to stop, bounded in iterations
  and time, and puts what it observed on ``results``; rank 0 reports on ``progress``, as
  they happen, ``("finished", id)``, ``("held", id)`` (a request held for its facts
  after an iteration) and ``("disconnected", 0)`` (its channel link broke), so the
  serving side waits on events rather than on time.
- ``MpiDist``: ``Distributed`` (``tensorrt_llm/_torch/distributed/communicator.py`` at
  ``a1cf28f9``): ``rank``, ``tp_size``, ``pp_size``, ``cp_size``, and
  ``broadcast(obj, root=0)``, which pickles rank 0's object and hands it to every other
  rank (``safe_broadcast``); here over one ``multiprocessing`` queue per follower.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.trtllm.fake_pyexecutor import (
    OUTPUT_TYPES,
    UTIL_MODULE,
    FakeKvCacheCreator,
    FakeKvCacheManager,
    FakeLlmRequest,
    FakePyExecutor,
    LlmRequestState,
    RequestScheduler,
    position_sampler,
)

BROADCAST_TIMEOUT_S = 30.0  # a follower waits this long for rank 0's object, then fails
IDLE_WAIT_S = 0.005  # rank 0's wait for a submission when nothing is active


@dataclass(frozen=True)
class World:
    """One fake MPI world: this rank, the size, rank 0's queue to each follower, and
    the serving process's queues by name (TensorRT-LLM passes its IPC queues to the
    workers as addresses, ``WorkerCommIpcAddrs``; ``multiprocessing`` queues cannot be
    pickled into a submitted task, so the worker's arguments name them)."""

    rank: int
    size: int
    to_followers: tuple[Any, ...]
    endpoints: dict[str, Any]


_world: World | None = None  # this process's world, as mpi4py's COMM_WORLD is


class MpiDist:
    """The executor's ``dist`` on this process's rank (one tensor-parallel group)."""

    def __init__(self, world: World) -> None:
        self._world = world
        self.rank = world.rank
        self.tp_size = world.size
        self.pp_size = 1
        self.cp_size = 1

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        assert root == 0
        if self._world.rank == 0:
            for q in self._world.to_followers:
                q.put(obj)
            return obj
        return self._world.to_followers[self._world.rank - 1].get(timeout=BROADCAST_TIMEOUT_S)


def _run_rank(payload: bytes, world: World) -> None:
    global _world
    _world = world
    task, kwargs = pickle.loads(payload)
    task(**kwargs)


class FakeMpiPoolSession:
    """``MpiPoolSession`` of ``n_workers`` spawned processes; ``endpoint(name)`` makes a
    queue between this process and the workers (see ``World``)."""

    def __init__(self, n_workers: int) -> None:
        self.n_workers = n_workers
        self._ctx = multiprocessing.get_context("spawn")
        self._endpoints: dict[str, Any] = {}
        self.processes: list[Any] = []

    def endpoint(self, name: str) -> Any:
        return self._endpoints.setdefault(name, self._ctx.Queue())

    def submit(self, task: Callable[..., Any], **kwargs: Any) -> list[Any]:
        payload = pickle.dumps((task, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        # Kept on the session: a queue must outlive the children's unpickling of it.
        self._to_followers = to_followers = tuple(
            self._ctx.Queue() for _ in range(self.n_workers - 1)
        )
        for rank in range(self.n_workers):
            world = World(rank, self.n_workers, to_followers, self._endpoints)
            process = self._ctx.Process(target=_run_rank, args=(payload, world), daemon=True)
            process.start()
            self.processes.append(process)
        return self.processes

    def shutdown(self, timeout_s: float = 10.0) -> None:
        for process in self.processes:
            process.join(timeout_s)
            if process.is_alive():
                process.terminate()
                process.join(timeout_s)


# ------------------------------------------------------------------ the fake release


class _Executor:
    """What the wrap and the factory read of a ``PyExecutor``."""

    def __init__(self, dist: MpiDist, kv: FakeKvCacheManager) -> None:
        self.dist = dist
        self.scheduler: Any = "SimpleScheduler"
        self.disable_overlap_scheduler = True
        self.enable_attention_dp = False
        self.resource_manager = types.SimpleNamespace(resource_managers={"KV": kv})


def create_py_executor_instance(*, dist: MpiDist, num_blocks: int, block_size: int) -> _Executor:
    return _Executor(dist, FakeKvCacheManager(num_blocks, block_size))


def worker_main(
    *,
    requests: str,
    results: str,
    progress: str,
    num_blocks: int,
    block_size: int,
    max_iterations: int,
    deadline_s: float,
) -> None:
    """One rank's worker: build the executor, run the loop, report (see the module)."""
    assert _world is not None, "not started by FakeMpiPoolSession"
    dist = MpiDist(_world)
    submissions, reports, finishes = (_world.endpoints[n] for n in (requests, results, progress))
    executor = CREATOR.create_py_executor_instance(
        dist=dist, num_blocks=num_blocks, block_size=block_size
    )
    adapter = executor.scheduler
    kv = executor.resource_manager.resource_managers["KV"]
    admitted: dict[int, dict[str, Any]] = {}
    fetched: dict[int, tuple[float, int]] = {}  # id: (time.monotonic(), iteration)
    iteration = 0
    if dist.rank == 0:
        add_request = adapter.engine.add_request

        def recording(submission: Any) -> Any:  # what rank 0's core was given
            rid = int(submission.request_id)
            admitted[rid] = {
                "priority": submission.priority,
                "tenant": submission.tenant,
                "time": time.monotonic(),
                "iteration": iteration,
            }
            return add_request(submission)

        adapter.engine.add_request = recording
    loop = FakePyExecutor(adapter, kv, position_sampler(1000))
    decisions: list[tuple[Any, ...]] = []
    stopping, timed_out = False, False
    deadline = time.monotonic() + deadline_s
    reported: set[int] = set()
    held: set[int] = set()
    link = getattr(adapter, "_facts", None)
    disconnected = False
    while not (stopping and not loop.has_work()):
        if iteration >= max_iterations or time.monotonic() > deadline:
            timed_out = True
            break
        taken: list[tuple[Any, ...]] = []
        if dist.rank == 0:
            try:
                wait = None if loop.has_work() else IDLE_WAIT_S
                taken.append(submissions.get(timeout=wait) if wait else submissions.get_nowait())
                while True:
                    taken.append(submissions.get_nowait())
            except queue.Empty:
                pass
        for message in dist.broadcast(taken if dist.rank == 0 else None):
            if message[0] == "submit":
                _, rid, prompt, max_tokens = message
                loop.submit(FakeLlmRequest(rid, list(prompt), max_tokens))
                fetched[rid] = (time.monotonic(), iteration)
            elif message[0] == "cancel":
                loop.cancel(message[1])
            else:
                stopping = True
        if loop.has_work():
            out = loop.iterate()
            decisions.append(
                (
                    tuple((r.py_request_id, r.context_chunk_size) for r in out.context_requests),
                    tuple(r.py_request_id for r in out.generation_requests),
                    tuple(r.py_request_id for r in out.paused_requests),
                )
            )
        if dist.rank == 0:
            for rid in loop.finished.keys() - reported:
                finishes.put(("finished", rid))
                reported.add(rid)
            for rid in adapter.awaiting_facts.keys() - held:
                finishes.put(("held", rid))
                held.add(rid)
            if link is not None and not link.connected and not disconnected:
                finishes.put(("disconnected", 0))
                disconnected = True
        iteration += 1
    reports.put(
        {
            "rank": dist.rank,
            "decisions": decisions,
            "finished": {
                rid: (list(r.tokens), r.num_generated, r.state.name)
                for rid, r in loop.finished.items()
            },
            "admitted": admitted,
            "fetched": fetched,
            "num_without_facts": adapter.num_without_facts,
            "refused": dict(adapter.refused),
            "follower_core_requests": len(adapter.scheduler.requests),
            "connected": None if link is None else link.connected,
            "kv_free": kv.num_free,
            "timed_out": timed_out,
        }
    )


class _Proxy(types.SimpleNamespace):
    def start_workers(self, session: FakeMpiPoolSession, **worker_kwargs: Any) -> list[Any]:
        return session.submit(self.worker_main, **worker_kwargs)


VERSION = "1.3.0rc27"
PROXY = _Proxy(worker_main=worker_main)
WORKER = types.SimpleNamespace(worker_main=worker_main)
CREATOR = types.SimpleNamespace(create_py_executor_instance=create_py_executor_instance)
MODULES: dict[str, Any] = {
    "tensorrt_llm": types.SimpleNamespace(__version__=VERSION),
    "tensorrt_llm._torch.pyexecutor.scheduler": types.SimpleNamespace(
        SchedulerOutput=OUTPUT_TYPES["1.3"],
        RequestScheduler=RequestScheduler,
    ),
    "tensorrt_llm._torch.pyexecutor.llm_request": types.SimpleNamespace(
        LlmRequestState=LlmRequestState
    ),
    "tensorrt_llm._torch.pyexecutor.resource_manager": types.SimpleNamespace(
        ResourceManagerType=types.SimpleNamespace(KV_CACHE_MANAGER="KV"),
        KVCacheManager=FakeKvCacheManager,
    ),
    "tensorrt_llm._torch.pyexecutor.py_executor_creator": CREATOR,
    UTIL_MODULE: types.SimpleNamespace(KvCacheCreator=FakeKvCacheCreator),
    "tensorrt_llm.executor.proxy": PROXY,
    "tensorrt_llm.executor.worker": WORKER,
}


def import_fake(name: str) -> Any:
    """``importlib.import_module`` over this process's fake release (module-level, so
    a ``WorkerSetup`` holding it pickles by reference)."""
    if name not in MODULES:
        raise ImportError(f"No module named {name!r}")
    return MODULES[name]
