"""Check the TensorRT-LLM names both executors use against the installed release. Run it
inside the NGC TensorRT-LLM container, from the project root:

    python -m plugins.trtllm.check_names [--mode all|engine|llm-api|in-executor]
                                         [--engine-dir BUILD_DIR] [--model MODEL]

Per mode (engine: ``tensorrt_llm.bindings.executor``; LLM-API: ``tensorrt_llm.llmapi``),
one line per check (``OK`` or ``MISSING``):

- every class, enum member, property, method and field in ``plugins.trtllm.names``
  exists (LLM-API mode: and every ``LLM`` keyword is a ``TorchLlmArgs`` field);
- every listed constructor takes the listed keywords by position as far as
  ``Binding.positional`` says, refuses ``None`` for each ``Binding.required`` keyword
  and accepts it for the others (the rules the fakes in tests/ follow);
- the adapter's own constructors run against the real module for representative
  settings and sampling parameters, through a wrapper that records each keyword
  passed, and together they pass every listed keyword;
- with ``--engine-dir`` (a build-engines output folder of a ``backend: engine`` build)
  or ``--model`` (a Hugging Face checkpoint folder or Hub id, or a ``backend: pytorch``
  build folder), the executor starts on it and greedily generates a few tokens (needs
  the GPU it was built for).

Keywords only some releases have (``Binding.optional``) are reported as present or
absent, and checked only where present.

In-executor mode (``names.IN_EXECUTOR_NAMES``, TensorRT-LLM's private PyTorch-executor
API): the installed release is inside the range ``in_executor/install.py`` was checked
against, its ``SchedulerOutput`` has the fields read for that line, every listed module,
class and class attribute exists, and ``TorchLlmArgs`` has the options this mode passes.
Attributes set per object (``PrivateNames.instance``) are listed, not checked: the
in-executor run of ``scripts/validate_on_gpu.sh`` exercises them.

``--mode all`` (the default) checks each mode the installed release has and says which
it skipped. Engine mode needs ``tensorrt_llm.bindings.executor.Executor`` itself: after
the engine backend's removal (after 1.3.0rc20) the module still imports (the PyTorch
backend uses its value types) but has no ``Executor``. Exit status: 0 when every check
run passes, 1 when any fails, 2 when no checked mode is available.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from orchestrator.common.name_checks import NameCheck, run_checks
from orchestrator.core import SamplingParams, ScheduledRequest, SchedulerOutput
from plugins.trtllm import translate
from plugins.trtllm.config import TrtllmExecutorConfig
from plugins.trtllm.errors import TrtllmError
from plugins.trtllm.llm_api import translate as llm_translate
from plugins.trtllm.llm_api.config import TrtllmLlmApiConfig
from plugins.trtllm.llm_api.guided import Guide
from plugins.trtllm.llm_api.settings import CudaGraphs, LlmApiSettings
from plugins.trtllm.llm_api.settings import load_settings as load_llm_settings
from plugins.trtllm.names import (
    ASYNC_ITERATION,
    BINDINGS,
    GENERATE_ASYNC_KEYWORDS,
    GENERATE_ASYNC_OPTIONAL,
    IN_EXECUTOR_LLM_OPTIONS,
    IN_EXECUTOR_NAMES,
    IN_EXECUTOR_PY_EXECUTOR_MODULE,
    IN_EXECUTOR_SCHEDULER_MODULE,
    LLM_API_BINDINGS,
    LLM_API_MODULE,
    MODULE,
    Binding,
)
from plugins.trtllm.settings import EngineSettings, load_settings

ImportModule = Callable[[str], Any]
Arguments = Callable[[Any], dict[str, Any]]

# Classes whose construction needs an engine or a model on a GPU: their keywords are
# covered by the live run (and, for LLM, by TorchLlmArgs' fields).
NEEDS_ENGINE = frozenset({"Executor", "LLM"})


# ---------------------------------------------------------------------------- names


def has_name(cls: Any, name: str) -> bool:
    """A pydantic field, a dataclass field, or any attribute (properties, methods, enum
    members, binding properties)."""
    fields = getattr(cls, "model_fields", None)
    if isinstance(fields, dict) and name in fields:
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    return hasattr(cls, name)


def _member_check(module: Any, module_name: str, owner: str, name: str) -> NameCheck:
    def run() -> str | None:
        cls = getattr(module, owner, None)
        if cls is None:
            return f"{module_name} has no {owner}"
        return None if has_name(cls, name) else f"{owner} has no {name!r}"

    return NameCheck(f"{owner}.{name}", run)


def _class_check(module: Any, module_name: str, name: str) -> NameCheck:
    def run() -> str | None:
        return None if hasattr(module, name) else f"{module_name} has no {name}"

    return NameCheck(name, run)


def name_checks(
    module: Any, bindings: Sequence[Binding] = BINDINGS, module_name: str = MODULE
) -> list[NameCheck]:
    """Existence of every listed class, enum member, property, method and field."""
    checks = []
    for binding in bindings:
        checks.append(_class_check(module, module_name, binding.name))
        for name in (*binding.members, *binding.attributes):
            checks.append(_member_check(module, module_name, binding.name, name))
    return checks


def llm_api_name_checks(llmapi: Any) -> list[NameCheck]:
    """LLM-API names, the async iteration of request outputs, and every ``LLM`` keyword
    but ``model`` as a ``TorchLlmArgs`` field (what ``LLM(**kwargs)`` validates against)."""
    checks = name_checks(llmapi, LLM_API_BINDINGS, LLM_API_MODULE)
    checks += [_member_check(llmapi, LLM_API_MODULE, "RequestOutput", n) for n in ASYNC_ITERATION]
    llm = next(b for b in LLM_API_BINDINGS if b.name == "LLM")
    checks += [_member_check(llmapi, LLM_API_MODULE, "TorchLlmArgs", k) for k in llm.keywords[1:]]
    checks += [_generate_async_check(llmapi, k) for k in GENERATE_ASYNC_KEYWORDS]
    for keyword in GENERATE_ASYNC_OPTIONAL:
        found = "present" if _takes(llmapi, keyword) else "absent here, not passed"
        checks.append(
            NameCheck(f"LLM.generate_async({keyword}=) (per release): {found}", lambda: None)
        )
    return checks


def _takes(llmapi: Any, keyword: str) -> bool:
    method = getattr(getattr(llmapi, "LLM", None), "generate_async", None)
    return method is not None and keyword in inspect.signature(method).parameters


def _generate_async_check(llmapi: Any, keyword: str) -> NameCheck:
    def run() -> str | None:
        return None if _takes(llmapi, keyword) else f"LLM.generate_async takes no {keyword}"

    return NameCheck(f"LLM.generate_async({keyword}=)", run)


# ---------------------------------------------------------------------------- signatures

# Valid values for every listed keyword of each value class, per module. The fakes'
# tests build the same objects, so the fakes and the real classes meet one table.
ENGINE_ARGUMENTS: dict[str, Arguments] = {
    "SchedulerConfig": lambda executor_bindings: {
        "capacity_scheduler_policy": executor_bindings.CapacitySchedulerPolicy.MAX_UTILIZATION
    },
    "KvCacheConfig": lambda executor_bindings: {
        "enable_block_reuse": True,
        "max_tokens": 4096,
        "free_gpu_memory_fraction": 0.5,
    },
    "OrchestratorConfig": lambda executor_bindings: {
        "is_orchestrator": True,
        "worker_executable_path": "/opt/tensorrt_llm/bin/executorWorker",
    },
    "ParallelConfig": lambda executor_bindings: {
        "communication_type": executor_bindings.CommunicationType.MPI,
        "communication_mode": executor_bindings.CommunicationMode.ORCHESTRATOR,
        "orchestrator_config": executor_bindings.OrchestratorConfig(),
    },
    "ExecutorConfig": lambda executor_bindings: {
        "max_beam_width": 1,
        "scheduler_config": executor_bindings.SchedulerConfig(),
        "kv_cache_config": executor_bindings.KvCacheConfig(),
        "enable_chunked_context": True,
        "max_batch_size": 8,
        "max_num_tokens": 256,
        "parallel_config": executor_bindings.ParallelConfig(),
        "extended_runtime_perf_knob_config": executor_bindings.ExtendedRuntimePerfKnobConfig(),
    },
    "SamplingConfig": lambda executor_bindings: {
        "beam_width": 1,
        "top_k": 40,
        "top_p": 0.9,
        "seed": 7,
        "temperature": 0.7,
    },
    "OutputConfig": lambda executor_bindings: {
        "return_log_probs": True,
        "exclude_input_from_output": True,
    },
    "Request": lambda executor_bindings: {
        "input_token_ids": [1, 2, 3],
        "max_tokens": 4,
        "streaming": True,
        "sampling_config": executor_bindings.SamplingConfig(),
        "output_config": executor_bindings.OutputConfig(),
        "end_id": 2,
        "pad_id": 0,
        "stop_words": [[3]],
    },
}

LLM_API_ARGUMENTS: dict[str, Arguments] = {
    "SchedulerConfig": lambda llmapi: {
        "capacity_scheduler_policy": llmapi.CapacitySchedulerPolicy.MAX_UTILIZATION,
        "waiting_queue_policy": llm_translate.priority_queue_policy(llmapi.SchedulerConfig),
    },
    "KvCacheConfig": lambda llmapi: {
        "enable_block_reuse": True,
        "free_gpu_memory_fraction": 0.5,
        "dtype": "auto",
        "tokens_per_block": 32,
        "use_kv_cache_manager_v2": False,
    },
    "CudaGraphConfig": lambda llmapi: {
        "batch_sizes": [1, 2, 4],
        "max_batch_size": 4,
        "enable_padding": True,
    },
    "SamplingParams": lambda llmapi: {
        "max_tokens": 4,
        "stop_token_ids": [2],
        "include_stop_str_in_output": True,
        "top_k": 40,
        "top_p": 0.9,
        "seed": 7,
        "temperature": 0.7,
        "logprobs": 1,
        "ignore_eos": True,
        "detokenize": False,
    },
}


def absent_optional(module: Any, binding: Binding) -> set[str]:
    """The binding's per-release keywords its class in ``module`` lacks."""
    cls = getattr(module, binding.name, None)
    return {k for k in binding.optional if cls is None or not has_name(cls, k)}


def optional_checks(module: Any, bindings: Sequence[Binding]) -> list[NameCheck]:
    """One always-passing line per per-release keyword, saying whether this release has
    it (the adapter passes it only where it does)."""
    checks = []
    for binding in bindings:
        absent = absent_optional(module, binding)
        for keyword in binding.optional:
            found = "absent here, not passed" if keyword in absent else "present"
            checks.append(
                NameCheck(f"{binding.name}.{keyword} (per release): {found}", lambda: None)
            )
    return checks


def signature_checks(
    module: Any, bindings: Sequence[Binding], arguments: Mapping[str, Arguments]
) -> list[NameCheck]:
    """Per value class with a table entry: the positional form constructs, and ``None``
    is refused for exactly the ``required`` keywords (per-release keywords where this
    release has them)."""
    checks = []
    for binding in bindings:
        if binding.name not in arguments:
            continue
        absent = absent_optional(module, binding)
        values = _without(arguments[binding.name], absent)
        checks.append(_positional_check(module, binding, values))
        checks += [
            _none_check(module, binding, values, keyword)
            for keyword in binding.keywords
            if keyword not in absent
        ]
    return checks


def _without(arguments: Arguments, absent: set[str]) -> Arguments:
    return lambda module: {k: v for k, v in arguments(module).items() if k not in absent}


def _positional_check(module: Any, binding: Binding, arguments: Arguments) -> NameCheck:
    def run() -> str | None:
        values = arguments(module)
        leading = binding.keywords[: binding.positional]
        rest = {k: v for k, v in values.items() if k not in leading}
        try:
            getattr(module, binding.name)(*[values[k] for k in leading], **rest)
        except Exception as err:  # any refusal is the finding
            return f"{type(err).__name__}: {err}"
        return None

    return NameCheck(
        f"{binding.name}({', '.join(binding.keywords[: binding.positional])}, ...)", run
    )


def _none_check(module: Any, binding: Binding, arguments: Arguments, keyword: str) -> NameCheck:
    required = keyword in binding.required

    def run() -> str | None:
        values = {**arguments(module), keyword: None}
        try:
            getattr(module, binding.name)(**values)
        except (TypeError, ValueError) as err:  # pydantic's ValidationError is a ValueError
            return None if required else f"refused: {type(err).__name__}: {err}"
        return "accepted" if required else None

    verb = "refuses" if required else "accepts"
    return NameCheck(f"{binding.name}({keyword}=None) {verb} None", run)


# ---------------------------------------------------------------------------- constructors


class Recorder:
    """Stands in for a TensorRT-LLM module: forwards every name to it and records, per
    class, the keywords each constructor call passed. Positional arguments are refused,
    since the adapter passes keywords only. Classes in ``record_only`` are recorded and
    not constructed (they need a model on a GPU)."""

    def __init__(self, module: Any, record_only: frozenset[str] = frozenset()) -> None:
        self.module = module
        self.record_only = record_only
        self.keywords: dict[str, set[str]] = {}

    def __getattr__(self, name: str) -> Any:
        target = None if name in self.record_only else getattr(self.module, name)
        return _RecordedClass(target, name, self.keywords)


class _RecordedClass:
    def __init__(self, target: Any, name: str, sink: dict[str, set[str]]) -> None:
        self._target, self._name, self._sink = target, name, sink

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"{self._name}() was called with positional arguments")
        self._sink.setdefault(self._name, set()).update(kwargs)
        return None if self._target is None else self._target(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def representative_settings() -> list[EngineSettings]:
    """One engine on one GPU with a KV cap, one across two GPUs (orchestrator mode)."""
    single = EngineSettings(
        engine_path=Path("engine"),
        tokens_per_block=32,
        max_batch_size=8,
        max_num_tokens=256,
        max_input_len=128,
        max_seq_len=256,
        world_size=1,
        kv_cache_free_gpu_memory_fraction=0.9,
        kv_cache_max_tokens=4096,
        enable_block_reuse=True,
        enable_chunked_context=True,
        cuda_graph_mode=True,
        cuda_graph_cache_size=8,
        capacity_scheduler_policy="GUARANTEED_NO_EVICT",
        pad_id=0,
    )
    multi = replace(
        single, world_size=2, kv_cache_max_tokens=None, capacity_scheduler_policy="MAX_UTILIZATION"
    )
    return [single, multi]


def representative_llm_settings() -> list[LlmApiSettings]:
    """One model with graphs for every size up to the batch, one across two GPUs with
    explicit graph sizes."""
    single = LlmApiSettings(
        model="checkpoint",
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        tokens_per_block=32,
        kv_cache_dtype="fp8",
        kv_cache_free_gpu_memory_fraction=0.9,
        enable_block_reuse=True,
        max_batch_size=8,
        max_num_tokens=256,
        max_input_len=128,
        max_seq_len=256,
        enable_chunked_prefill=True,
        cuda_graphs=CudaGraphs(None, 8, True),
        capacity_scheduler_policy="GUARANTEED_NO_EVICT",
    )
    multi = replace(
        single,
        tensor_parallel_size=2,
        cuda_graphs=CudaGraphs((1, 2, 4, 8), None, False),
        capacity_scheduler_policy="MAX_UTILIZATION",
    )
    return [single, multi]


REPRESENTATIVE_SAMPLING = {
    "greedy": SamplingParams(max_tokens=4, temperature=0),
    "sampled": SamplingParams(
        max_tokens=4,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        seed=7,
        stop_token_ids=(2, 3),
        logprobs=0,
    ),
    "full distribution": SamplingParams(max_tokens=4, temperature=1.0),
}
_WORKER_PATH = Path("/opt/tensorrt_llm/bin/executorWorker")  # never started: construction only


def _constructs(label: str, build: Callable[[], Any]) -> NameCheck:
    def run() -> str | None:
        try:
            build()
        except Exception as err:  # any refusal is the finding
            return f"{type(err).__name__}: {err}"
        return None

    return NameCheck(label, run)


def construction_checks(recorder: Recorder) -> list[NameCheck]:
    """Engine mode's own constructors, run against the module ``recorder`` wraps."""
    checks = []
    for settings in representative_settings():
        label = f"ExecutorConfig (world size {settings.world_size}, "
        label += f"{settings.capacity_scheduler_policy})"
        checks.append(
            _constructs(label, partial(translate.executor_config, recorder, settings, _WORKER_PATH))
        )
    for name, params in REPRESENTATIVE_SAMPLING.items():
        build = partial(translate.request, recorder, [1, 2, 3], 4, params, seed=11, pad_id=0)
        checks.append(_constructs(f"Request ({name})", build))
    return checks


def llm_construction_checks(recorder: Recorder) -> list[NameCheck]:
    """LLM-API mode's own constructors (``LLM`` itself recorded, not started), with the
    per-release options this module offers."""
    checks = []
    release = llm_translate.release_options(recorder.module)
    for settings in representative_llm_settings():
        label = f"LLM options (TP {settings.tensor_parallel_size}, "
        label += f"{settings.capacity_scheduler_policy})"
        build = partial(llm_translate.start_llm, recorder, settings, release)
        checks.append(_constructs(label, build))
    for name, params in REPRESENTATIVE_SAMPLING.items():
        build = partial(llm_translate.sampling_params, recorder, params, 4, 11)
        checks.append(_constructs(f"SamplingParams ({name})", build))
    # One guide of each field GuidedDecodingParams is given (llm_api/guided.py).
    greedy = REPRESENTATIVE_SAMPLING["greedy"]
    for guide in REPRESENTATIVE_GUIDES:
        build = partial(llm_translate.sampling_params, recorder, greedy, 4, None, guide)
        checks.append(_constructs(f"SamplingParams (guided_decoding {guide.field})", build))
    return checks


REPRESENTATIVE_GUIDES = (
    Guide("json", '{"type": "object"}'),
    Guide("json_object", True),
    Guide("regex", "[0-9]+"),
    Guide("grammar", 'start: "yes" | "no"'),
)


def coverage_check(recorder: Recorder, bindings: Sequence[Binding] = BINDINGS) -> NameCheck:
    """Run after the construction checks: every listed keyword was passed at least once
    (those of classes not recorded in this mode excepted)."""

    def run() -> str | None:
        unused = [
            f"{b.name}({k}=)"
            for b in bindings
            if b.name not in NEEDS_ENGINE or b.name in recorder.record_only
            for k in b.keywords
            if k not in recorder.keywords.get(b.name, set())
            and k not in absent_optional(recorder.module, b)
        ]
        return None if not unused else "never passed: " + ", ".join(unused)

    return NameCheck("every listed constructor keyword was exercised", run)


# ---------------------------------------------------------------------------- live runs


def live_check(executor_bindings: Any, build_dir: Path, out: TextIO) -> NameCheck:
    """Start the engine-mode executor on a real engine and generate a few greedy tokens."""

    def run() -> str | None:
        from plugins.trtllm.executor import TrtllmExecutor

        config = TrtllmExecutorConfig(engine_dir=build_dir)
        try:
            executor = TrtllmExecutor.open(config, load_settings(config), module=executor_bindings)
        except Exception as err:
            return f"could not start: {type(err).__name__}: {err}"
        try:
            tokens = generate(executor, executor.settings.tokens_per_block, list(range(1, 9)), 4)
        except Exception as err:
            return f"generation failed: {type(err).__name__}: {err}"
        finally:
            executor.shutdown()
        print(
            f"         KV blocks: {executor.info().num_kv_blocks}, greedy tokens: {tokens}",
            file=out,
        )
        return None

    return NameCheck(f"live run on {build_dir}", run)


def llm_live_check(llmapi: Any, model: str, out: TextIO) -> NameCheck:
    """Start the LLM-API executor on ``model`` and generate a few greedy tokens."""

    def run() -> str | None:
        from plugins.trtllm.llm_api.executor import TrtllmLlmApiExecutor

        path = Path(model)
        is_build = (path / "manifest.json").is_file()
        config = TrtllmLlmApiConfig(
            build_dir=path if is_build else None, model=None if is_build else model
        )
        try:
            executor = TrtllmLlmApiExecutor.open(config, load_llm_settings(config), module=llmapi)
        except Exception as err:
            return f"could not start: {type(err).__name__}: {err}"
        try:
            tokens = generate(executor, executor.settings.tokens_per_block, list(range(1, 9)), 4)
            kv = executor.kv_cache_stats()
        except Exception as err:
            return f"generation failed: {type(err).__name__}: {err}"
        finally:
            executor.shutdown()
        print(
            f"         KV blocks: {kv.max_blocks} ({kv.free_blocks} free), greedy tokens: {tokens}",
            file=out,
        )
        return None

    return NameCheck(f"live run on {model}", run)


def generate(executor: Any, block_size: int, prompt: list[int], max_tokens: int) -> list[int]:
    """Drive one greedy request through plans as the scheduler would: the whole prompt
    in one step, then one decode per step."""
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0)
    tokens = list(prompt)
    out: list[int] = []
    start, chunk = 0, list(prompt)
    while len(out) < max_tokens:
        plan = SchedulerOutput(
            [
                ScheduledRequest(
                    request_id="check",
                    token_ids=chunk,
                    start_position=start,
                    block_table=list(range(-(-len(tokens) // block_size))),
                    sample=True,
                    sampling=sampling,
                )
            ]
        )
        result = executor.execute(plan)
        if "check" in result.failed:
            raise RuntimeError(result.failed["check"])
        token = result.sampled["check"]
        out.append(token)
        start, chunk = len(tokens), [token]
        tokens.append(token)
    executor.execute(SchedulerOutput(finished_ids=["check"]))
    return out


# ---------------------------------------------------------------------------- in-executor


def in_executor_checks(import_module: ImportModule, version: str, out: TextIO) -> list[NameCheck]:
    """The release gate, the ``SchedulerOutput`` fields, every listed private name, and
    every name ``PyExecutor`` reaches on its scheduler (``scheduler_use_checks``)."""
    from plugins.trtllm.in_executor import install

    def gate() -> str | None:
        try:
            line = install.release_line(version)
            sched = import_module(IN_EXECUTOR_SCHEDULER_MODULE)
            install.check_interface(line, sched.SchedulerOutput, sched.RequestScheduler)
        except Exception as err:  # reported as the check's failure
            return str(err)
        return None

    checks = [NameCheck(f"TensorRT-LLM {version} in the checked range, its interface", gate)]
    for entry in IN_EXECUTOR_NAMES:
        module = _imported(import_module, entry.module)
        if module is None:
            checks.append(_fails(entry.module, f"{entry.module} does not import"))
            continue
        if not entry.owner:
            checks += [_class_check(module, entry.module, n) for n in entry.names]
        else:
            checks.append(_class_check(module, entry.module, entry.owner))
            checks += [_member_check(module, entry.module, entry.owner, n) for n in entry.names]
        if entry.instance:
            print(
                f"note     {entry.owner}: per-object attributes {', '.join(entry.instance)} "
                "(set in __init__; exercised by the in-executor GPU run)",
                file=out,
            )
    llmapi = _imported(import_module, LLM_API_MODULE)
    for option in IN_EXECUTOR_LLM_OPTIONS:
        if llmapi is None:
            checks.append(
                NameCheck(f"TorchLlmArgs.{option}", lambda: f"{LLM_API_MODULE} does not import")
            )
        else:
            checks.append(_member_check(llmapi, LLM_API_MODULE, "TorchLlmArgs", option))
    return checks + scheduler_use_checks(import_module)


# A use of the executor's scheduler in PyExecutor's source: self.scheduler.<name>.
_SCHEDULER_USE = re.compile(r"\bself\.scheduler\.([A-Za-z_]\w*)")


def scheduler_use_checks(import_module: ImportModule) -> list[NameCheck]:
    """One check per name the installed ``PyExecutor`` reaches on its scheduler
    (``self.scheduler.<name>`` anywhere in its class source), each looked up on our
    scheduler as the installer builds it (derived from the installed
    ``RequestScheduler``): a newer executor calling a method ours lacks fails here, not
    in the first iteration on a GPU."""
    from plugins.trtllm.in_executor import install

    label = "PyExecutor's calls on its scheduler"
    py_executor = _imported(import_module, IN_EXECUTOR_PY_EXECUTOR_MODULE)
    sched = _imported(import_module, IN_EXECUTOR_SCHEDULER_MODULE)
    if py_executor is None or sched is None:
        return [_fails(label, "the executor or scheduler module does not import")]
    try:
        source = inspect.getsource(py_executor.PyExecutor)
        ours = install.derived_scheduler(sched.RequestScheduler)
    except (AttributeError, OSError, TypeError, TrtllmError) as err:
        return [_fails(label, str(err))]

    def check(name: str) -> NameCheck:
        def run() -> str | None:
            if hasattr(ours, name):
                return None
            return f"PyExecutor calls self.scheduler.{name}; the in-executor scheduler has none"

        return NameCheck(f"PyExecutor calls self.scheduler.{name}", run)

    return [check(name) for name in sorted(set(_SCHEDULER_USE.findall(source)))]


def _fails(label: str, why: str) -> NameCheck:
    """A check that failed before it could run (its module does not import)."""
    return NameCheck(label, lambda: why)


def _imported(import_module: ImportModule, name: str) -> Any | None:
    try:
        return import_module(name)
    except ImportError:
        return None


# ---------------------------------------------------------------------------- main


def engine_checks(executor_bindings: Any, engine_dir: Path | None, out: TextIO) -> list[NameCheck]:
    recorder = Recorder(executor_bindings)
    checks = [
        *name_checks(executor_bindings),
        *signature_checks(executor_bindings, BINDINGS, ENGINE_ARGUMENTS),
        *construction_checks(recorder),
        coverage_check(recorder),
    ]
    if engine_dir is not None:
        checks.append(live_check(executor_bindings, engine_dir, out))
    return checks


def llm_api_checks(llmapi: Any, model: str | None, out: TextIO) -> list[NameCheck]:
    recorder = Recorder(llmapi, record_only=frozenset({"LLM"}))
    checks = [
        *llm_api_name_checks(llmapi),
        *optional_checks(llmapi, LLM_API_BINDINGS),
        *signature_checks(llmapi, LLM_API_BINDINGS, LLM_API_ARGUMENTS),
        *llm_construction_checks(recorder),
        coverage_check(recorder, LLM_API_BINDINGS),
    ]
    if model is not None:
        checks.append(llm_live_check(llmapi, model, out))
    return checks


def main(
    argv: Sequence[str] | None = None,
    *,
    import_module: ImportModule = importlib.import_module,
    out: TextIO = sys.stdout,
) -> int:
    parser = argparse.ArgumentParser(
        description="Check the TensorRT-LLM names the trtllm and trtllm-llmapi executors use."
    )
    parser.add_argument(
        "--mode", choices=("all", "engine", "llm-api", "in-executor"), default="all"
    )
    parser.add_argument(
        "--engine-dir", type=Path, help="backend: engine build folder to run live (needs a GPU)"
    )
    parser.add_argument(
        "--model",
        help="checkpoint folder, Hub id or backend: pytorch build folder to run live in "
        "LLM-API mode (needs a GPU)",
    )
    args = parser.parse_args(argv)
    modes = [
        ("engine", MODULE, " (engine mode needs TensorRT-LLM 1.2.x)"),
        ("llm-api", LLM_API_MODULE, ""),
        ("in-executor", IN_EXECUTOR_SCHEDULER_MODULE, " (in-executor scheduling)"),
    ]
    checks: list[NameCheck] = []
    imported = 0
    for mode, module_name, needs in modes:
        if args.mode not in ("all", mode):
            continue
        try:
            module = import_module(module_name)
        except ImportError as err:
            print(
                f"SKIPPED  {mode} mode: {module_name} is not importable here ({err}); "
                f"run this inside the NGC TensorRT-LLM container{needs}",
                file=out,
            )
            continue
        version = getattr(import_module("tensorrt_llm"), "__version__", "unknown version")
        if mode == "engine" and not hasattr(module, "Executor"):
            print(
                f"SKIPPED  engine mode: {module_name} has no Executor in TensorRT-LLM "
                f"{version} (the engine backend was removed after 1.3.0rc20; only "
                "LLM-API mode runs on this release)",
                file=out,
            )
            continue
        imported += 1
        print(f"{mode} mode: {module_name} (TensorRT-LLM {version})", file=out)
        if mode == "engine":
            checks += engine_checks(module, args.engine_dir, out)
        elif mode == "llm-api":
            checks += llm_api_checks(module, args.model, out)
        else:
            checks += in_executor_checks(import_module, version, out)
    if not imported:
        return 2
    return 1 if run_checks(checks, out) else 0


if __name__ == "__main__":
    sys.exit(main())
