"""Check the TensorRT-LLM names the trtllm adapter uses against the installed release.
Run it inside the NGC TensorRT-LLM container, from the project root:

    python -m plugins.trtllm.check_names [--engine-dir BUILD_DIR]

Three kinds of check, one line each (``OK`` or ``MISSING``):

- every class, enum member, property and method in ``plugins.trtllm.names`` exists;
- the adapter's own constructors (``plugins.trtllm.translate``) run against the real
  bindings for representative settings and sampling parameters, through a wrapper that
  records each keyword passed, and together they pass every listed keyword (so the
  list, the adapter and the real signatures agree);
- with ``--engine-dir`` (a build-engines output folder; needs the GPU it was built
  for), the executor starts on that engine and greedily generates a few tokens.

Exit status: 0 when every check passes, 1 when any fails, 2 when the bindings cannot
be imported.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from build_engines.check_trtllm_names import NameCheck, run_checks
from orchestrator.core import SamplingParams, ScheduledRequest, SchedulerOutput
from plugins.trtllm import translate
from plugins.trtllm.config import TrtllmExecutorConfig
from plugins.trtllm.names import BINDINGS, MODULE
from plugins.trtllm.settings import EngineSettings, load_settings

ImportModule = Callable[[str], Any]


# ---------------------------------------------------------------------------- names


def _member_check(tle: Any, owner: str, name: str) -> NameCheck:
    def run() -> str | None:
        cls = getattr(tle, owner, None)
        if cls is None:
            return f"{MODULE} has no {owner}"
        return None if hasattr(cls, name) else f"{owner} has no {name!r}"

    return NameCheck(f"{owner}.{name}", run)


def _class_check(tle: Any, name: str) -> NameCheck:
    def run() -> str | None:
        return None if hasattr(tle, name) else f"{MODULE} has no {name}"

    return NameCheck(name, run)


def name_checks(tle: Any) -> list[NameCheck]:
    """Existence of every listed class, enum member, property and method."""
    checks = []
    for binding in BINDINGS:
        checks.append(_class_check(tle, binding.name))
        checks += [_member_check(tle, binding.name, m) for m in binding.members]
        checks += [_member_check(tle, binding.name, a) for a in binding.attributes]
    return checks


# ---------------------------------------------------------------------------- constructors


class Recorder:
    """Stands in for the bindings module: forwards every name to it and records, per
    class, the keywords each constructor call passed. Positional arguments are refused,
    since the names list covers keywords only."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.keywords: dict[str, set[str]] = {}

    def __getattr__(self, name: str) -> Any:
        return _RecordedClass(getattr(self._module, name), name, self.keywords)


class _RecordedClass:
    def __init__(self, target: Any, name: str, sink: dict[str, set[str]]) -> None:
        self._target, self._name, self._sink = target, name, sink

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"{self._name}() was called with positional arguments")
        self._sink.setdefault(self._name, set()).update(kwargs)
        return self._target(**kwargs)

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
        except Exception as err:  # any binding error is the finding
            return f"{type(err).__name__}: {err}"
        return None

    return NameCheck(label, run)


def construction_checks(recorder: Recorder) -> list[NameCheck]:
    """The adapter's own constructors, run against the module ``recorder`` wraps."""
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


# Constructing these needs a built engine: the live run covers their keywords.
NEEDS_ENGINE = frozenset({"Executor"})


def coverage_check(recorder: Recorder) -> NameCheck:
    """Run after ``construction_checks``: every listed keyword was passed at least once
    (those of ``NEEDS_ENGINE`` classes excepted)."""

    def run() -> str | None:
        unused = [
            f"{b.name}({k}=)"
            for b in BINDINGS
            if b.name not in NEEDS_ENGINE
            for k in b.keywords
            if k not in recorder.keywords.get(b.name, set())
        ]
        return None if not unused else "never passed: " + ", ".join(unused)

    return NameCheck("every listed constructor keyword was exercised", run)


# ---------------------------------------------------------------------------- live run


def live_check(tle: Any, build_dir: Path, out: TextIO) -> NameCheck:
    """Start the executor on a real engine and generate a few greedy tokens."""

    def run() -> str | None:
        from plugins.trtllm.executor import TrtllmExecutor

        config = TrtllmExecutorConfig(engine_dir=build_dir)
        try:
            executor = TrtllmExecutor.open(config, load_settings(config), bindings=tle)
        except Exception as err:
            return f"could not start: {type(err).__name__}: {err}"
        try:
            tokens = _generate(executor, prompt=list(range(1, 9)), max_tokens=4)
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


def _generate(executor: Any, prompt: list[int], max_tokens: int) -> list[int]:
    """Drive one greedy request through plans as the scheduler would: the whole prompt
    in one step, then one decode per step."""
    block_size = executor.settings.tokens_per_block
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0)
    tokens = list(prompt)
    out: list[int] = []
    start, chunk = 0, list(prompt)
    while len(out) < max_tokens:
        table = list(range(-(-len(tokens) // block_size)))
        plan = SchedulerOutput([ScheduledRequest("check", chunk, start, table, True, sampling)])
        token = executor.execute(plan).sampled["check"]
        out.append(token)
        start, chunk = len(tokens), [token]
        tokens.append(token)
    executor.execute(SchedulerOutput(finished_ids=["check"]))
    return out


# ---------------------------------------------------------------------------- main


def main(
    argv: Sequence[str] | None = None,
    *,
    import_module: ImportModule = importlib.import_module,
    out: TextIO = sys.stdout,
) -> int:
    parser = argparse.ArgumentParser(
        description="Check the TensorRT-LLM executor bindings the trtllm adapter uses."
    )
    parser.add_argument(
        "--engine-dir", type=Path, help="build-engines output folder to run live (needs a GPU)"
    )
    args = parser.parse_args(argv)
    try:
        tle = import_module(MODULE)
    except ImportError as err:
        print(
            f"{MODULE} is not importable here ({err}); run this inside the NGC "
            "TensorRT-LLM container",
            file=out,
        )
        return 2
    print(f"{MODULE} {getattr(tle, '__version__', 'unknown version')}", file=out)
    recorder = Recorder(tle)
    checks = [*name_checks(tle), *construction_checks(recorder), coverage_check(recorder)]
    if args.engine_dir is not None:
        checks.append(live_check(tle, args.engine_dir, out))
    return 1 if run_checks(checks, out) else 0


if __name__ == "__main__":
    sys.exit(main())
