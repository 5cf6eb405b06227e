"""Put the in-executor scheduler where TensorRT-LLM builds its own, behind a version gate.

TensorRT-LLM has no plug-in point for the request scheduler: its
``docs/source/torch/scheduler.md`` says to write a ``RequestScheduler`` and change
``create_py_executor_instance`` in ``tensorrt_llm/_torch/pyexecutor/_util.py``, which
builds ``SimpleScheduler(capacity_scheduler, mb_scheduler)`` and passes it to
``PyExecutor(resource_manager, scheduler, ...)`` (stored copies of ``_util.py`` read;
the index exposes no commit id). Rather than edit TensorRT-LLM, ``install`` wraps that
function where it is called: ``tensorrt_llm/_torch/pyexecutor/py_executor_creator.py``
imports it by name (``from ._util import (..., create_py_executor_instance, ...)``), so
the wrap replaces ``py_executor_creator.create_py_executor_instance``, as TensorRT-LLM's
own tests do (``monkeypatch.setattr(py_executor_creator,
"create_py_executor_instance", ...)``). The ``PyExecutor`` it returns gets our scheduler
as its ``scheduler`` attribute, which ``PyExecutor._schedule`` calls each iteration
(TensorRT-LLM sets the attribute the same way itself when an older ``_util.py``
rebuilds the KV cache manager: ``py_executor.scheduler = scheduler``). Private API: the
gate below names the releases whose interface this was checked against and refuses
others.

The wrap acts in the process that builds the executor. On one tensor-parallel rank,
in-executor mode runs TensorRT-LLM's worker in the serving process
(``TLLM_WORKER_USE_SINGLE_PROCESS=1``, the switch TensorRT-LLM's own tests set to reach
the in-process ``PyExecutor``) and installs there. On more, every rank is an MPI worker
process and ``workers`` installs the same wrap in each of them (``install(...,
single_process=False)``).
"""

from __future__ import annotations

import importlib
import os
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugins.trtllm.errors import TrtllmError
from plugins.trtllm.in_executor.adapter import (
    KNOWN_OUTPUT_FIELDS,
    CoreRequestScheduler,
    TrtllmTypes,
)
from plugins.trtllm.names import (
    IN_EXECUTOR_CREATOR_MODULE,
    IN_EXECUTOR_FACTORY,
    IN_EXECUTOR_KV_CREATOR,
    IN_EXECUTOR_KV_ESTIMATION,
    IN_EXECUTOR_LLM_OPTIONS,
    IN_EXECUTOR_LLM_REQUEST_MODULE,
    IN_EXECUTOR_RESOURCE_MANAGER_MODULE,
    IN_EXECUTOR_SCHEDULER_MODULE,
    IN_EXECUTOR_UTIL_MODULE,
)

# Modules and names used here, as plugins.trtllm.names lists them (check_names checks
# them in the container).
CREATOR_MODULE = IN_EXECUTOR_CREATOR_MODULE
SCHEDULER_MODULE = IN_EXECUTOR_SCHEDULER_MODULE
LLM_REQUEST_MODULE = IN_EXECUTOR_LLM_REQUEST_MODULE
RESOURCE_MANAGER_MODULE = IN_EXECUTOR_RESOURCE_MANAGER_MODULE
FACTORY_NAME = IN_EXECUTOR_FACTORY
UTIL_MODULE = IN_EXECUTOR_UTIL_MODULE
ESTIMATION_NAME = IN_EXECUTOR_KV_ESTIMATION
SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"
(OVERLAP_OPTION,) = IN_EXECUTOR_LLM_OPTIONS  # the LLM option (TorchLlmArgs field)

# The releases whose scheduler interface was read. Their SchedulerOutput namedtuples:
# 1.2.x, the flat scheduler.py (tensorrt_llm/_torch/pyexecutor/scheduler.py at 034fffb0),
# five fields; the 1.3 line's scheduler/ package has the same five at 5f480b7a
# (scheduler/scheduler.py) and, at 002f3cc3, ``encoder_requests`` first and
# ``scheduled_mm_encoder_items`` (default None) last. Any shape is accepted that has the
# five, fills every other field we know by name (KNOWN_OUTPUT_FIELDS), and leaves any
# further field at its namedtuple default; a further field with no default is refused.
CHECKED_RELEASES = "1.2.x and 1.3.x (pre-releases of 1.3.0 included)"
CHECKED_LINES = ("1.2", "1.3")
REQUIRED_OUTPUT_FIELDS = (
    "context_requests",
    "generation_requests",
    "paused_requests",
    "fitting_disagg_gen_init_requests",
    "num_fitting_requests",
)
assert set(REQUIRED_OUTPUT_FIELDS) <= KNOWN_OUTPUT_FIELDS

_VERSION = re.compile(r"^(\d+)\.(\d+)")


def release_line(version: str) -> str:
    """``"1.2"`` or ``"1.3"`` for a checked release; ``TrtllmError`` naming the checked
    range for any other (``1.4.0rc4``, ``1.1.0``, an unparsable string)."""
    match = _VERSION.match(version.strip())
    line = f"{match.group(1)}.{match.group(2)}" if match else None
    if line not in CHECKED_LINES:
        raise TrtllmError(
            f"scheduling: in_executor was checked against TensorRT-LLM {CHECKED_RELEASES}; "
            f"the installed release is {version}. Remove executor.scheduling (or set it "
            "to front) to let TensorRT-LLM's own scheduler run under ours, or install a "
            "checked release"
        )
    return line


def check_interface(line: str, output_type: Any, request_scheduler: Any) -> None:
    """Refuse a release whose scheduler interface is not one the adapter can fill: a
    ``SchedulerOutput`` without the five fields every checked shape has, or with a
    field the adapter does not know and the namedtuple gives no default; a
    ``RequestScheduler`` without ``schedule_request``."""
    fields = tuple(getattr(output_type, "_fields", ()))
    defaults = getattr(output_type, "_field_defaults", {})
    missing = [f for f in REQUIRED_OUTPUT_FIELDS if f not in fields]
    unfillable = [f for f in fields if f not in KNOWN_OUTPUT_FIELDS and f not in defaults]
    if missing or unfillable:
        problems = [f"lacks {missing}"] if missing else []
        problems += [f"has {unfillable} with no default"] if unfillable else []
        raise TrtllmError(
            f"scheduling: in_executor: this TensorRT-LLM {line} release's SchedulerOutput "
            f"(fields {fields}) {' and '.join(problems)}: the adapter fills "
            f"{sorted(KNOWN_OUTPUT_FIELDS)} by name and leaves defaulted fields alone; remove "
            "executor.scheduling to use TensorRT-LLM's own scheduler"
        )
    if not callable(getattr(request_scheduler, "schedule_request", None)):
        raise TrtllmError(
            "scheduling: in_executor: RequestScheduler.schedule_request is missing in "
            "this TensorRT-LLM release"
        )


@dataclass(frozen=True)
class Release:
    """The installed release as the installer uses it."""

    version: str
    line: str
    creator: Any  # py_executor_creator, which calls create_py_executor_instance
    kv_cache_creator: Any  # _util.KvCacheCreator, whose estimation pass runs an executor
    scheduler_class: type[CoreRequestScheduler]  # ours, derived from its RequestScheduler
    types: TrtllmTypes
    kv_manager_key: Any  # the resource_managers key of the KV cache manager
    kv_manager_class: type  # resource_manager.KVCacheManager, the V1 manager


def load_release(import_module: Callable[[str], Any] = importlib.import_module) -> Release:
    """Import and check the installed TensorRT-LLM (``import_module`` replaces
    ``importlib.import_module`` in tests). Raises ``TrtllmError`` naming the checked
    range for any other release."""
    version = str(import_module("tensorrt_llm").__version__)
    line = release_line(version)
    sched = import_module(SCHEDULER_MODULE)
    check_interface(line, sched.SchedulerOutput, sched.RequestScheduler)
    states = import_module(LLM_REQUEST_MODULE).LlmRequestState
    resources = import_module(RESOURCE_MANAGER_MODULE)
    key_type = getattr(resources, "ResourceManagerType", None)
    key = key_type.KV_CACHE_MANAGER if key_type is not None else "kv_cache_manager"
    types = TrtllmTypes(
        sched.SchedulerOutput,
        states.CONTEXT_INIT,
        states.GENERATION_IN_PROGRESS,
        states.GENERATION_COMPLETE,
    )
    kv_cache_creator = getattr(import_module(UTIL_MODULE), IN_EXECUTOR_KV_CREATOR)
    return Release(
        version,
        line,
        import_module(CREATOR_MODULE),
        kv_cache_creator,
        derived_scheduler(sched.RequestScheduler),
        types,
        key,
        resources.KVCacheManager,
    )


def derived_scheduler(base: type) -> type[CoreRequestScheduler]:
    """``CoreRequestScheduler`` with the release's ``RequestScheduler`` as a base, so that
    whatever concrete methods that base has (newer executors call some on their
    scheduler) are ours too, and ``isinstance`` checks against it hold. Raises
    ``TrtllmError`` when the base declares an abstract member ours does not provide."""
    derived = type("CoreRequestScheduler", (CoreRequestScheduler, base), {})
    missing = sorted(getattr(derived, "__abstractmethods__", ()))
    if missing:
        raise TrtllmError(
            "scheduling: in_executor: this TensorRT-LLM release's RequestScheduler asks for "
            f"{', '.join(missing)}, which the in-executor scheduler does not provide; "
            "remove executor.scheduling"
        )
    return derived


SchedulerFactory = Callable[[Any, Release], Any]
"""Builds our scheduler for a new ``PyExecutor`` (the executor, the release)."""


def install(
    release: Release, factory: SchedulerFactory, *, single_process: bool = True
) -> Callable[[], None]:
    """Wrap ``create_py_executor_instance`` so that every ``PyExecutor`` it builds gets
    ``factory(py_executor, release)`` as its scheduler, except while
    ``KvCacheCreator.configure_kv_cache_capacity`` runs it (the KV estimation pass
    ``create_py_executor`` makes on a first executor before building the serving one,
    ``_util.py`` and ``py_executor_creator.py``, stored copies): then TensorRT-LLM's own
    scheduler runs it. Returns the undo. With
    ``single_process`` (one rank, installed in the serving process) also asks
    TensorRT-LLM to run its worker in this process, which the wrap then reaches; in a
    worker process (``workers``) the wrap is already where the executor is built."""
    creator = release.creator
    original = getattr(creator, FACTORY_NAME)
    if getattr(original, "_in_executor_wrapped", False):
        raise TrtllmError("the in-executor scheduler is already installed in this process")
    estimation = release.kv_cache_creator
    original_estimation = getattr(estimation, ESTIMATION_NAME)
    inherited = ESTIMATION_NAME not in vars(estimation)
    # TensorRT-LLM's own scheduler of each executor built, for its estimation pass.
    own: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def create_py_executor_instance(*args: Any, **kwargs: Any) -> Any:
        py_executor = original(*args, **kwargs)
        check_executor(py_executor)
        own[py_executor] = py_executor.scheduler
        py_executor.scheduler = factory(py_executor, release)
        return py_executor

    def configure_kv_cache_capacity(self: Any, py_executor: Any, *args: Any, **kwargs: Any) -> Any:
        # The estimation pass (LLM() waits for it with no timeout) runs dummy requests of
        # up to min(max_num_tokens, max_seq_len - 1) tokens over a pool sized exactly for
        # them: our core's context limit, KV headroom or queue limits could refuse one,
        # and nobody would hear it. TensorRT-LLM's own scheduler runs it, as it would
        # without us; the executor is dropped afterwards.
        ours = py_executor.scheduler
        py_executor.scheduler = own.pop(py_executor, ours)
        try:
            return original_estimation(self, py_executor, *args, **kwargs)
        finally:
            py_executor.scheduler = ours

    create_py_executor_instance._in_executor_wrapped = True  # type: ignore[attr-defined]
    setattr(creator, FACTORY_NAME, create_py_executor_instance)
    setattr(estimation, ESTIMATION_NAME, configure_kv_cache_capacity)
    previous_env = os.environ.get(SINGLE_PROCESS_ENV)
    if single_process:
        os.environ[SINGLE_PROCESS_ENV] = "1"

    def undo() -> None:
        setattr(creator, FACTORY_NAME, original)
        if inherited:
            delattr(estimation, ESTIMATION_NAME)
        else:
            setattr(estimation, ESTIMATION_NAME, original_estimation)
        if not single_process:
            return
        if previous_env is None:
            os.environ.pop(SINGLE_PROCESS_ENV, None)
        else:
            os.environ[SINGLE_PROCESS_ENV] = previous_env

    return undo


def check_executor(py_executor: Any) -> None:
    """Refuse an executor the adapter cannot schedule (tensor parallelism is fine: rank
    0 decides, the others follow, ``ranks``):

    - more than one pipeline-parallel rank (``dist.pp_size``): ``PyExecutor`` then runs
      ``_executor_loop_pp``, whose micro-batches keep requests in flight across
      schedules (``inflight_req_ids``), which the adapter does not read, and only the
      last stage samples, so the tokens the core needs at the next call are not on rank
      0's host in time;
    - context parallelism (``dist.cp_size`` > 1), never read;
    - attention data parallelism (``enable_attention_dp``): each rank then schedules its
      own requests (``can_schedule`` balancing, ``tp_allgather`` of batch sizes), which
      one decision broadcast from rank 0 contradicts;
    - the overlap scheduler on (``disable_overlap_scheduler`` false: each step's tokens
      reach the host an iteration late, after the next schedule, and the core needs
      them at the next call);
    - batch waiting (``enable_batch_waiting``): ``PyExecutor._schedule`` then passes the
      scheduled context requests through ``_waiting_requests``, which can hold them all
      back while generation requests run (``py_executor.py``, stored copy with
      ``_prepare_and_schedule_batch``), so a planned chunk would not run.

    ``dist`` is TensorRT-LLM's ``Distributed``
    (``tensorrt_llm/_torch/distributed/communicator.py`` at ``a1cf28f9``: ``pp_size``,
    ``cp_size`` are properties of its ``Mapping``); ``enable_attention_dp`` is set in
    ``PyExecutor.__init__`` from the model engine (``py_executor.py``, stored copy)."""
    dist = getattr(py_executor, "dist", None)
    for name, what in (("pp_size", "pipeline"), ("cp_size", "context")):
        size = getattr(dist, name, 1)
        if isinstance(size, int) and size > 1:
            raise TrtllmError(
                f"scheduling: in_executor runs on one {what}-parallel rank (this executor "
                f"has {name} {size}); set it to 1, or remove executor.scheduling"
            )
    if getattr(py_executor, "enable_attention_dp", False) is True:
        raise TrtllmError(
            "scheduling: in_executor cannot run with attention data parallelism (each "
            "rank would schedule its own requests); turn enable_attention_dp off, or "
            "remove executor.scheduling"
        )
    if getattr(py_executor, "enable_batch_waiting", False) is True:
        raise TrtllmError(
            "scheduling: in_executor cannot run with TensorRT-LLM's batch waiting "
            "(batch_wait_timeout_iters / batch_wait_max_tokens_ratio): it holds back the "
            "context chunks our scheduler planned; unset them, or remove executor.scheduling"
        )
    if getattr(py_executor, "disable_overlap_scheduler", True) is False:
        raise TrtllmError(
            "scheduling: in_executor needs TensorRT-LLM's overlap scheduler off "
            f"({OVERLAP_OPTION}=True, which the executor passes); this executor has it on"
        )


def kv_cache_manager(py_executor: Any, release: Release) -> Any:
    """The executor's KV cache manager (``resource_manager.resource_managers``, the
    lookup ``PyExecutor``'s statistics use). It must be the V1 manager
    (``resource_manager.KVCacheManager``), the one whose allocation rule the core
    mirrors (whole prompt at the first chunk, a block per ``tokens_per_block`` generated
    tokens). The V2 manager (``KVCacheManagerV2``, a separate class, with its own
    ``KVCacheV2Scheduler``) is pinned off where ``use_kv_cache_manager_v2`` exists; a
    release that builds it anyway is refused here, before the first iteration."""
    managers = py_executor.resource_manager.resource_managers
    manager = managers.get(release.kv_manager_key)
    if manager is None:
        raise TrtllmError("scheduling: in_executor needs TensorRT-LLM's KV cache manager")
    if not isinstance(manager, release.kv_manager_class):
        raise TrtllmError(
            "scheduling: in_executor mirrors TensorRT-LLM's V1 KV cache manager "
            f"(resource_manager.KVCacheManager); this executor runs "
            f"{type(manager).__name__}. Remove executor.scheduling to use TensorRT-LLM's "
            "own scheduler"
        )
    return manager
