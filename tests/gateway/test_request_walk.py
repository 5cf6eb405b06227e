"""The walk of a chat request with tools through the gateway's files, traced: the request
goes down through each file at most once, and no file calls back up.

What is traced (``sys.setprofile`` on the event loop's thread): every function called in
a file under ``orchestrator/gateway/`` from the moment the route
(``routes.chat_completions``) is entered until the response has been sent. A call is a
*step* when it enters another file than that of the nearest traced frame below it on the
stack: one file handing the request to another. Calls within a file, a coroutine or
generator resuming, reading a property (a value, such as ``ChoiceState.finished``) and
calls with no traced frame below them (the route itself, a task the serving layer started,
the framework sending a streamed body) are not steps.

Left out of the trace: the API models (``protocol/``: the request and response values
that every step reads, not a step of their own); the server's frame around every request
(``middleware.py``: the request id, the ASGI receive channel, the log mark;
``lifecycle.py``: readiness and the in-flight count); and the close
(``OpenAIServing._close`` and everything it calls: aborting what still runs, metrics and
the log line, once the response has ended). The tokenizer is a test double, outside the
gateway.

The steps are cut where the engine comes in. The *walk down* is every step before the
request is submitted (``AsyncEngine.submit``). After it, the *way back* is one *round* per
engine output, each starting where the output enters the gateway
(``ChoiceState.advance``), after round 0, which holds what comes before the first output
(a stream's opening chunks, the wait for a constrained stream's first output).
Consecutive steps into one file count once; in a round, so does a stretch of steps
repeated back to back (the deltas of several outputs sent in one round).

Asserted, for a chat request with ``tools`` (``tool_choice`` ``auto``, ``required`` and a
named function, whole and streamed): the walk down visits no file twice; no round visits a
file twice; and nothing goes back up: the steps' (caller file, called file) pairs, over
the whole request, form no cycle.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
from fastapi.testclient import TestClient

import orchestrator.gateway
from orchestrator.common.async_engine import AsyncEngine
from orchestrator.gateway import routes
from orchestrator.gateway.app import create_app
from orchestrator.gateway.choice import ChoiceState
from orchestrator.gateway.config import ServeConfig
from orchestrator.gateway.lifecycle import LoadedModel
from orchestrator.gateway.serving import OpenAIServing
from tests.gateway.constrained import ByteTokenizer, ConstrainedCore
from tests.gateway.support import sse_events, wait_until

pytestmark = pytest.mark.timeout(120)

GATEWAY = Path(orchestrator.gateway.__file__).parent
LEFT_OUT = ("protocol", "middleware.py", "lifecycle.py")  # first part of the path
RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
ROUTE = routes.chat_completions.__code__
SUBMIT = AsyncEngine.submit.__code__
ADVANCE = ChoiceState.advance.__code__
CLOSE = OpenAIServing._close.__code__


def _property_getters() -> frozenset[CodeType]:
    """The code of every property getter of a class defined in the gateway."""
    codes = set()
    for info in pkgutil.walk_packages(orchestrator.gateway.__path__, "orchestrator.gateway."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__:
                for attr in vars(cls).values():
                    if isinstance(attr, property) and attr.fget is not None:
                        codes.add(attr.fget.__code__)
    return frozenset(codes)


PROPERTIES = _property_getters()

MODEL = "byte-model"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},
]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _file(code: CodeType) -> str | None:
    """The traced name of ``code``'s file (its path under the gateway), or ``None``."""
    path = Path(code.co_filename)
    if not path.is_relative_to(GATEWAY):
        return None
    name = path.relative_to(GATEWAY).as_posix()
    return None if name.startswith(LEFT_OUT) else name


@dataclass
class Step:
    caller: str | None  # None: the route, where the walk begins
    called: str
    output: bool = False  # an engine output entering the gateway (ChoiceState.advance)


@dataclass
class Trace:
    """The steps of one request (see the module docstring); ``submitted`` is the number of
    steps taken before the engine submission."""

    steps: list[Step] = field(default_factory=list)
    submitted: int | None = None
    thread: int | None = None
    armed: bool = False
    _frames: dict[int, FrameType] = field(default_factory=dict)  # resumable, kept alive

    def start(self) -> None:
        self.steps, self.submitted, self.thread, self._frames = [], None, None, {}
        self.armed = True

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not self.armed:
            return
        code = frame.f_code
        if code is ROUTE and self.thread is None:
            self.thread = threading.get_ident()
            self.steps.append(Step(None, "routes.py"))
            return
        if threading.get_ident() != self.thread:
            return
        if code is SUBMIT:
            if self.submitted is None:
                self.submitted = len(self.steps)
            return
        called = _file(code)
        if called is None or code in PROPERTIES:
            return
        if code.co_flags & RESUMABLE:
            if id(frame) in self._frames:
                return  # resumed, not called
            self._frames[id(frame)] = frame
        caller = None
        below = frame.f_back if code is not CLOSE else None
        while below is not None:
            if below.f_code is CLOSE:
                return
            if caller is None:
                caller = _file(below.f_code)
            below = below.f_back
        if code is not CLOSE and caller is not None and caller != called:
            self.steps.append(Step(caller, called, output=code is ADVANCE))

    def walk_down(self) -> list[str]:
        end = len(self.steps) if self.submitted is None else self.submitted
        return collapse([s.called for s in self.steps[:end]], stretches=False)

    def rounds(self) -> list[list[str]]:
        rounds: list[list[str]] = [[]]
        for step in self.steps[self.submitted or 0 :]:
            if step.output:
                rounds.append([])
            rounds[-1].append(step.called)
        return [collapse(r, stretches=True) for r in rounds]

    def cycle(self) -> list[str] | None:
        """A cycle of files handing the request to one another, if there is one."""
        edges: dict[str, set[str]] = {}
        for s in self.steps:
            if s.caller is not None:
                edges.setdefault(s.caller, set()).add(s.called)

        def find(path: list[str]) -> list[str] | None:
            for nxt in sorted(edges.get(path[-1], ())):
                if nxt in path:
                    return [*path[path.index(nxt) :], nxt]
                found = find([*path, nxt])
                if found:
                    return found
            return None

        return next((c for start in sorted(edges) if (c := find([start]))), None)

    def describe(self) -> str:
        """The walk down and the rounds, alike rounds back to back shown once."""
        lines = [f"walk down: {' -> '.join(self.walk_down())}", "way back:"]
        rounds = self.rounds()
        first = 0
        for i, r in enumerate(rounds):
            if i + 1 == len(rounds) or rounds[i + 1] != r:
                span = f"{first}" if first == i else f"{first}-{i}"
                lines.append(f"  round {span}: {' -> '.join(r) or '(no step)'}")
                first = i + 1
        return "\n".join(lines)


def collapse(files: list[str], stretches: bool) -> list[str]:
    """``files`` with consecutive repeats of one file (``stretches``: or of one stretch of
    files) once."""
    out = list(files)
    changed = True
    while changed:
        changed = False
        for size in range(1, len(out) // 2 + 1 if stretches else 2):
            for i in range(len(out) - 2 * size + 1):
                if out[i : i + size] == out[i + size : i + 2 * size]:
                    del out[i + size : i + 2 * size]
                    changed = True
                    break
            if changed:
                break
    return out


def repeated(files: list[str]) -> list[str]:
    return sorted({f for f in files if files.count(f) > 1})


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[TestClient, Trace]]:
    trace = Trace()
    config = ServeConfig.model_validate(
        {"model": {"name": MODEL, "max_model_len": 4096}, "executor": {"type": "sim"}}
    )
    core = ConstrainedCore(lambda submission: CALL)
    app = create_app(config, lambda: LoadedModel(core, ByteTokenizer()), {})
    threading.setprofile(trace.profile)  # the TestClient's event loop thread starts below
    try:
        with TestClient(app) as client:
            wait_until(lambda: client.get("/ready").status_code == 200)
            yield client, trace
    finally:
        threading.setprofile(None)


def _send(client: TestClient, trace: Trace, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's tool calls, from the whole response or joined from the stream."""
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "weather?"}], **body}
    trace.start()
    try:
        if not body.get("stream"):
            r = client.post("/v1/chat/completions", json=payload)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "tool_calls"
            return list(choice["message"]["tool_calls"])
        with client.stream("POST", "/v1/chat/completions", json=payload) as r:
            assert r.status_code == 200
            events = list(sse_events(r.iter_lines()))
    finally:
        trace.armed = False
    chunks = [json.loads(e) for e in events[:-1]]
    pieces = [tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])]
    return pieces


@pytest.mark.parametrize(
    "body",
    [
        {"tools": TOOLS},
        {"tools": TOOLS, "tool_choice": "required"},
        {"tools": TOOLS, "tool_choice": NAMED},
        {"tools": TOOLS, "stream": True},
        {"tools": TOOLS, "tool_choice": "required", "stream": True},
    ],
    ids=["auto", "required", "named", "streamed-auto", "streamed-required"],
)
def test_a_chat_request_with_tools_visits_each_gateway_file_once_going_down(
    traced: tuple[TestClient, Trace], body: dict[str, Any]
) -> None:
    client, trace = traced
    calls = _send(client, trace, body)
    assert calls and calls[0]["function"]["name"] == "get_weather"
    walk = trace.describe()
    assert trace.submitted is not None, walk
    down = trace.walk_down()
    assert down[:2] == ["routes.py", "serving.py"], walk
    assert repeated(down) == [], walk
    for r in trace.rounds():
        assert repeated(r) == [], walk
    assert trace.cycle() is None, f"a file calls back up: {trace.cycle()}\n{walk}"
