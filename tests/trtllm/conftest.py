"""Fixtures: fake build folders, executors started on them over the fake bindings, and a
spy copy of the bindings that records what the adapter sends."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from plugins.trtllm import TrtllmExecutor, TrtllmExecutorConfig
from plugins.trtllm.settings import load_settings
from tests.trtllm import fake_tensorrt_llm
from tests.trtllm.builds import FakeBuild, write_build

StartExecutor = Callable[..., TrtllmExecutor]


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
            config, load_settings(config), bindings=bindings or spy_bindings(calls)
        )
        started.append(executor)
        return executor

    yield start
    for executor in started:
        executor.shutdown()
