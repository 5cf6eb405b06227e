"""Fixtures: fake build folders, executors of both modes started on them over the fakes,
and spy copies of the fakes that record what the adapters send."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from plugins.trtllm import (
    TrtllmExecutor,
    TrtllmExecutorConfig,
    TrtllmLlmApiConfig,
    TrtllmLlmApiExecutor,
)
from plugins.trtllm.llm_api.settings import load_settings as load_llm_settings
from plugins.trtllm.settings import load_settings
from tests.trtllm import fake_llmapi, fake_tensorrt_llm
from tests.trtllm.builds import FakeBuild, write_build

StartExecutor = Callable[..., TrtllmExecutor]
StartLlmExecutor = Callable[..., TrtllmLlmApiExecutor]
PYTORCH = FakeBuild(backend="pytorch")


@dataclass
class Calls:
    """What the adapter asked of the executor: configs, ``(engine id, Request)`` pairs in
    enqueue order, and cancelled engine ids."""

    configs: list[Any] = field(default_factory=list)
    enqueued: list[tuple[int, Any]] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)

    def inputs(self) -> list[list[int]]:
        """Input tokens of each enqueued request, the warm-up request left out."""
        return [r.input_token_ids for _, r in self.enqueued[1:]]


def spy_bindings(calls: Calls, executor_base: type | None = None) -> types.SimpleNamespace:
    """The fake bindings with an ``Executor`` that records into ``calls``."""
    base = executor_base or fake_tensorrt_llm.Executor

    class SpyExecutor(base):  # type: ignore[misc, valid-type]
        def __init__(self, **kwargs: Any) -> None:
            calls.configs.append(kwargs["executor_config"])
            super().__init__(**kwargs)

        def enqueue_request(self, request: Any) -> int:
            engine_id = super().enqueue_request(request)
            calls.enqueued.append((engine_id, request))
            return engine_id

        def cancel_request(self, id: int) -> None:
            calls.cancelled.append(id)
            super().cancel_request(id)

    names = {n: getattr(fake_tensorrt_llm, n) for n in fake_tensorrt_llm.__all__}
    names["Executor"] = SpyExecutor
    return types.SimpleNamespace(**names)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def start_executor(tmp_path: Path, calls: Calls) -> Iterator[StartExecutor]:
    """``start_executor(build=FakeBuild(...), bindings=..., **options)``: an executor
    over the spy bindings (recording into ``calls``) on a fresh build folder; every one
    started is shut down afterwards."""
    started: list[TrtllmExecutor] = []

    def start(
        build: FakeBuild | None = None, bindings: Any = None, **options: Any
    ) -> TrtllmExecutor:
        root = write_build(tmp_path / f"build{len(started)}", build)
        config = TrtllmExecutorConfig(engine_dir=root, **options)
        executor = TrtllmExecutor.open(
            config, load_settings(config), module=bindings or spy_bindings(calls)
        )
        started.append(executor)
        return executor

    yield start
    for executor in started:
        executor.shutdown()


@dataclass
class LlmCalls:
    """What the LLM-API adapter asked of the LLM: its options, and ``(inputs,
    SamplingParams, RequestOutput)`` per ``generate_async`` call in order."""

    options: list[dict[str, Any]] = field(default_factory=list)
    submitted: list[tuple[list[int], Any, Any]] = field(default_factory=list)
    generate_options: list[dict[str, Any]] = field(default_factory=list)

    def inputs(self) -> list[list[int]]:
        """Input tokens of each submitted request, the warm-up request left out."""
        return [inputs for inputs, _, _ in self.submitted[1:]]

    def cancelled(self) -> list[int]:
        """Indexes (warm-up left out) of the submitted requests that ended cancelled."""
        return [
            i
            for i, (_, _, output) in enumerate(self.submitted[1:])
            if output.outputs[0].finish_reason == "cancelled"
        ]


def spy_llmapi(calls: LlmCalls, llm_base: type | None = None) -> types.SimpleNamespace:
    """The fake LLM API with an ``LLM`` that records into ``calls``."""
    base = llm_base or fake_llmapi.LLM

    class SpyLLM(base):  # type: ignore[misc, valid-type]
        def __init__(self, model: Any, **kwargs: Any) -> None:
            calls.options.append({"model": model, **kwargs})
            super().__init__(model, **kwargs)

        def generate_async(self, inputs: Any, sampling_params: Any = None, **options: Any) -> Any:
            output = super().generate_async(inputs, sampling_params, **options)
            calls.submitted.append((list(inputs), sampling_params, output))
            calls.generate_options.append(options)
            return output

        # The adapter probes generate_async's parameters: show the base's.
        generate_async.__signature__ = inspect.signature(base.generate_async)  # type: ignore[attr-defined]

    names = {n: getattr(fake_llmapi, n) for n in fake_llmapi.__all__}
    names["LLM"] = SpyLLM
    return types.SimpleNamespace(**names)


@pytest.fixture
def llm_calls() -> LlmCalls:
    return LlmCalls()


@pytest.fixture
def start_llm_executor(tmp_path: Path, llm_calls: LlmCalls) -> Iterator[StartLlmExecutor]:
    """``start_llm_executor(build=FakeBuild(backend="pytorch", ...), llmapi=..., **options)``:
    an LLM-API executor over the spy LLM API (recording into ``llm_calls``) on a fresh
    PyTorch-backend build folder; every one started is shut down afterwards."""
    started: list[TrtllmLlmApiExecutor] = []

    def start(
        build: FakeBuild | None = None, llmapi: Any = None, **options: Any
    ) -> TrtllmLlmApiExecutor:
        root = write_build(tmp_path / f"pytorch{len(started)}", build or PYTORCH)
        config = TrtllmLlmApiConfig(build_dir=root, **options)
        executor = TrtllmLlmApiExecutor.open(
            config, load_llm_settings(config), module=llmapi or spy_llmapi(llm_calls)
        )
        started.append(executor)
        return executor

    yield start
    for executor in started:
        executor.shutdown()


class Mode:
    """One TensorRT-LLM mode as the shared executor tests see it: ``start`` an executor
    on a fresh fake build (``FakeBuild`` fields as keywords in ``build``, executor
    options as the rest), and what the adapter sent, in the same terms for both modes
    (the warm-up request left out)."""

    def __init__(self, name: str, start: Callable[..., Any], record: Calls | LlmCalls) -> None:
        self.name = name
        self._start = start
        self._record = record
        self.backend = "engine" if name == "engine" else "pytorch"

    def start(self, build: dict[str, Any] | None = None, **options: Any) -> Any:
        return self._start(FakeBuild(backend=self.backend, **(build or {})), **options)

    def options(self, root: Path) -> TrtllmExecutorConfig | TrtllmLlmApiConfig:
        """The executor options of the build folder ``root``."""
        if isinstance(self._record, LlmCalls):
            return TrtllmLlmApiConfig(build_dir=root)
        return TrtllmExecutorConfig(engine_dir=root)

    def from_config(self, options: Any, engine: Any) -> Any:
        """``from_config`` of the mode's executor over its spy module."""
        if isinstance(self._record, LlmCalls):
            return TrtllmLlmApiExecutor.from_config(
                options, engine, module=spy_llmapi(self._record)
            )
        return TrtllmExecutor.from_config(options, engine, module=spy_bindings(self._record))

    def inputs(self) -> list[list[int]]:
        return self._record.inputs()

    def cancelled(self) -> list[int]:
        """Indexes of the submitted requests the adapter cancelled (aborted)."""
        record = self._record
        if isinstance(record, LlmCalls):
            return record.cancelled()
        ids = set(record.cancelled)
        return [i for i, (engine_id, _) in enumerate(record.enqueued[1:]) if engine_id in ids]

    def max_tokens(self) -> list[int]:
        if isinstance(self._record, LlmCalls):
            return [p.max_tokens for _, p, _ in self._record.submitted[1:]]
        return [r.max_tokens for _, r in self._record.enqueued[1:]]

    def seeds(self) -> list[int | None]:
        if isinstance(self._record, LlmCalls):
            return [p.seed for _, p, _ in self._record.submitted[1:]]
        return [r.sampling_config.seed for _, r in self._record.enqueued[1:]]

    def forget(self) -> None:
        """Drop what was recorded (before starting another executor in one test)."""
        if isinstance(self._record, LlmCalls):
            self._record.submitted.clear()
        else:
            self._record.enqueued.clear()


@pytest.fixture(params=["engine", "llm-api"])
def mode(
    request: pytest.FixtureRequest,
    start_executor: StartExecutor,
    calls: Calls,
    start_llm_executor: StartLlmExecutor,
    llm_calls: LlmCalls,
) -> Mode:
    """Each test that takes ``mode`` runs once per TensorRT-LLM mode."""
    if request.param == "engine":
        return Mode("engine", start_executor, calls)
    return Mode("llm-api", start_llm_executor, llm_calls)
