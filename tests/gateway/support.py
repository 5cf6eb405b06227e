"""Test doubles and helpers for the gateway: a word-level fake tokenizer, a fake executor
that takes real time, engines and apps built on them, and an in-process uvicorn."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
from fastapi.testclient import TestClient

from orchestrator.core import ConstraintKind, ConstraintSpec
from orchestrator.core.clock import WallClock
from orchestrator.core.engine import EngineCore
from orchestrator.core.output import SchedulerOutput, StepResult, TokenLogprobs
from orchestrator.core.sched.constraints import ConstraintCompiles
from orchestrator.gateway.app import create_app
from orchestrator.gateway.config import ServeConfig
from orchestrator.gateway.lifecycle import LoadedModel, Loader
from orchestrator.gateway.server import GatewayServer, build_server
from tests.factories import make_scheduler
from tests.fakes import FakeExecutor

MODEL = "fake-model"
EOS = 1000  # FakeExecutor samples in [0, 1000): it never ends a request by itself
VOCAB = 1001


class WordTokenizer:
    """Token ``i < 1000`` is the word `` w<i>``; ``1000`` is the special end token.
    Unknown words hash to an id, so any text encodes."""

    eos_token_ids: tuple[int, ...] = (EOS,)
    vocab_size = VOCAB
    renders_tools = False

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if word.startswith("w") and word[1:].isdigit() and int(word[1:]) < EOS:
                ids.append(int(word[1:]))
            else:
                digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
                ids.append(int.from_bytes(digest, "little") % EOS)
        return ids

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        text = " ".join(f"{m['role']} {m['content']}" for m in messages)
        return self.encode(f"{text} assistant")

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        words = []
        for t in token_ids:
            if t == EOS:
                if not skip_special_tokens:
                    words.append("<eos>")
            else:
                words.append(f" w{t}")
        return "".join(words)

    def token_bytes(self, token_id: int) -> bytes:
        return self.decode([token_id], skip_special_tokens=False).encode()


class TimedExecutor(FakeExecutor):
    """``FakeExecutor`` whose steps take ``step_time_s`` of real time (so requests stay
    in flight long enough to cancel them), with made-up logprobs when asked for."""

    def execute(self, plan: SchedulerOutput) -> StepResult:
        started = time.monotonic()
        result = super().execute(plan)
        logprobs = {}
        for s in plan.scheduled:
            if s.sample and s.sampling.logprobs is not None:
                token = result.sampled[s.request_id]
                top = [(token, -0.25), ((token + 1) % EOS, -1.5), ((token + 2) % EOS, -2.5)]
                logprobs[s.request_id] = TokenLogprobs(-0.25, top[: s.sampling.logprobs])
        time.sleep(max(0.0, self.step_time_s - (time.monotonic() - started)))
        return StepResult(result.sampled, time.monotonic() - started, logprobs)


def fake_config(**server: Any) -> ServeConfig:
    """An engine config for the fake model (256-token context); ``server`` overrides
    ``server`` settings. The executor type is only a placeholder: tests build the
    executor themselves."""
    return ServeConfig.model_validate(
        {
            "model": {"name": MODEL, "max_model_len": 256},
            "executor": {"type": "sim"},
            "server": server,
        }
    )


class AcceptingExecutor(TimedExecutor):
    """A ``TimedExecutor`` that claims every constraint kind and accepts any spec (its
    tokens obey none: for tests of the API's statuses and shapes, not of the mask)."""

    def compile_constraint(self, spec: ConstraintSpec) -> object:
        return spec


def fake_core(
    step_time_s: float = 0.002,
    num_blocks: int = 64,
    accept_constraints: bool = False,
    **scheduler: Any,
) -> tuple[EngineCore, TimedExecutor]:
    """An engine over a timed fake executor; with ``accept_constraints`` constrained
    requests are admitted (through the core's compile path) instead of refused."""
    kind = AcceptingExecutor if accept_constraints else TimedExecutor
    executor = kind(num_blocks=num_blocks, block_size=16, step_time_s=step_time_s)
    sched = make_scheduler(num_blocks=num_blocks, block_size=16, max_model_len=256, **scheduler)
    if accept_constraints:
        sched.constraints = ConstraintCompiles(sched.config.constraints, executor, ConstraintKind)
    return EngineCore(sched, executor, WallClock()), executor


def fake_loader(core: EngineCore) -> Loader:
    return lambda: LoadedModel(core, WordTokenizer())


def fake_app(core: EngineCore, environ: dict[str, str] | None = None, **server: Any) -> Any:
    return create_app(fake_config(**server), fake_loader(core), environ or {})


def wait_until(condition: Any, timeout_s: float = 10.0) -> None:
    """Poll ``condition()`` every 10 ms until true; fail after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.01)


@contextlib.contextmanager
def client_for(core: EngineCore, **server: Any) -> Iterator[TestClient]:
    """The app over ``core`` in process (TestClient runs its lifespan), once ready.
    ``server`` overrides ``server`` settings; ``environ`` is the environment it reads."""
    environ = server.pop("environ", None)
    with TestClient(fake_app(core, environ, **server)) as client:
        wait_until(lambda: client.get("/ready").status_code == 200)
        yield client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running_server(
    config: ServeConfig, loader: Loader | None = None, ready_timeout_s: float = 300.0
) -> Iterator[tuple[str, GatewayServer]]:
    """uvicorn on 127.0.0.1 in a thread of this process; yields (base URL, server) once
    ``/ready`` answers 200, and stops it afterwards."""
    port = free_port()
    server = build_server(config, "127.0.0.1", port, loader)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, ready_timeout_s, alive=thread.is_alive)
        yield base, server
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def wait_ready(base: str, timeout_s: float, alive: Any = lambda: True) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("the server exited before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/ready", timeout=5).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{base} not ready after {timeout_s} s")


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text (``labels`` as in the text, e.g.
    ``finish_reason="stop"``)."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == wanted:
            return float(value)
    raise KeyError(f"no sample {wanted} in metrics")


def sse_events(lines: Iterator[str]) -> Iterator[str]:
    """The data payloads of a server-sent event stream, ``[DONE]`` included."""
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: ") :]
