"""The fleet lane's tests, run by ``test_fleet_lane.py`` inside a private network
namespace (they skip anywhere else): Dynamo's frontend with its KV router and two
``orchestrator dynamo-worker`` processes on the default model, on 127.0.0.1, driven by
the official ``openai`` client through the frontend.

Each worker's prompt-token counters (``orchestrator_prompt_tokens_total`` and
``orchestrator_prompt_tokens_cached_total`` on its Dynamo system port) say which worker
served a request and what its prefix cache held. Every process is killed at the end,
whatever happened.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from plugins.dynamo.local_fleet import (
    FleetError,
    LocalFleet,
    Process,
    metric,
    model_listed,
    prompt_counters,
)

WORKER_CONFIG = Path(__file__).with_name("worker.yaml")
MODEL = "SmolLM2-135M-Instruct"
FRONTEND_PORT = 8190
SYSTEM_PORTS = (9301, 9302)
START_TIMEOUT_S = 240.0  # both model loads, cold caches on two cores
REQUEST_TIMEOUT_S = 120.0

pytestmark = pytest.mark.skipif(
    os.environ.get("ORCHESTRATOR_FLEET_NETNS") != "1",
    reason="runs inside the fleet lane's private network namespace (test_fleet_lane.py)",
)


@dataclass
class Fleet:
    processes: LocalFleet
    client: openai.OpenAI

    @property
    def workers(self) -> list[Process]:
        return self.processes.processes[1:]

    def wait_until(self, condition: Callable[[], bool], what: str, timeout_s: float) -> None:
        try:
            self.processes.wait_until(condition, what, timeout_s)
        except FleetError as err:
            pytest.fail(str(err))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    processes = LocalFleet(tmp_path_factory.mktemp("fleet"))
    try:
        processes.start_frontend("frontend", FRONTEND_PORT, ["--router-mode", "kv"])
        for index, port in enumerate(SYSTEM_PORTS):
            processes.start_worker(f"worker{index}", WORKER_CONFIG, port)
        fleet = Fleet(
            processes,
            openai.OpenAI(
                base_url=f"http://127.0.0.1:{FRONTEND_PORT}/v1",
                api_key="unused",
                timeout=REQUEST_TIMEOUT_S,
                max_retries=0,
            ),
        )
        fleet.wait_until(
            lambda: (
                processes.registered_workers() == len(SYSTEM_PORTS)
                and model_listed(FRONTEND_PORT, MODEL)
            ),
            "both workers to register with the frontend",
            START_TIMEOUT_S,
        )
        yield fleet
    finally:
        processes.stop()


def test_chat_and_completions(fleet: Fleet) -> None:
    chat = fleet.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name one colour."}],
        max_tokens=8,
        temperature=0,
    )
    assert chat.choices[0].message.content
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage is not None and 1 <= chat.usage.completion_tokens <= 8
    completion = fleet.client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert completion.choices[0].text
    assert completion.usage is not None and completion.usage.prompt_tokens > 0


def test_streaming_carries_usage_on_the_last_chunk(fleet: Fleet) -> None:
    stream = fleet.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count from one to five."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = [], None, None
    for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(text)
    assert finish in ("stop", "length")
    assert usage is not None and 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_json_schema_response_format_is_enforced(fleet: Fleet) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    chat = fleet.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "How many legs has a cat? Answer in JSON."}],
        max_tokens=40,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema},
        },
    )
    content = chat.choices[0].message.content
    assert content is not None
    data = json.loads(content)
    assert set(data) == {"answer"} and isinstance(data["answer"], int)


def test_a_field_the_engine_cannot_honour_is_refused_by_name(fleet: Fleet) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        fleet.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            frequency_penalty=0.5,
        )
    assert "sampling_options.frequency_penalty" in str(info.value)


def test_admissions_refusal_reaches_the_client_as_a_429(fleet: Fleet) -> None:
    # Over worker.yaml's max_waiting_tokens (600) even with nothing queued, so every
    # worker refuses it (OverloadedError, queue_tokens_full) whatever the load.
    with pytest.raises(openai.RateLimitError) as info:
        fleet.client.completions.create(model=MODEL, prompt="lighthouse " * 700, max_tokens=4)
    assert info.value.status_code == 429


def test_a_shared_prefix_lands_on_the_worker_that_holds_it(fleet: Fleet) -> None:
    prefix = (
        "You are the archivist of a mountain library. Every answer you give cites the "
        "shelf, the row and the year the book was catalogued, and you never invent a "
        "volume that the catalogue does not hold. The catalogue lists atlases, herbals, "
        "ledgers of the salt trade, three centuries of weather diaries, and the letters "
        "of the surveyors who first mapped the pass. Visitors ask short questions. "
    ) * 3
    before = prompt_counters(SYSTEM_PORTS)
    cached: list[int] = []
    prompt_tokens = 0
    for question in ("Where are the atlases?", "Who mapped the pass?", "Any herbals?", "Salt?"):
        chat = fleet.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": prefix}, {"role": "user", "content": question}],
            max_tokens=2,
            temperature=0,
        )
        assert chat.usage is not None
        details = chat.usage.prompt_tokens_details
        cached.append((details.cached_tokens or 0) if details is not None else 0)
        prompt_tokens += chat.usage.prompt_tokens
    after = prompt_counters(SYSTEM_PORTS)
    served = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    hits = [a[1] - b[1] for a, b in zip(after, before, strict=True)]
    # One worker served every request, and from the second on its prefix cache held
    # the shared system prompt (several hundred tokens, whole 16-token blocks).
    assert sorted(served) == [0, prompt_tokens], served
    holder = served.index(prompt_tokens)
    assert hits[1 - holder] == 0
    assert min(cached[1:]) >= 256, cached
    assert hits[holder] == sum(cached)


def test_a_client_that_goes_away_frees_its_kv_blocks(fleet: Fleet) -> None:
    stream = fleet.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe every lighthouse you know."}],
        max_tokens=900,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))
    stream.close()  # the client disconnects mid-stream
    fleet.wait_until(
        lambda: any("aborted: its KV blocks are freed" in w.tail(200_000) for w in fleet.workers),
        "the worker to abort the request",
        REQUEST_TIMEOUT_S,
    )
    fleet.wait_until(
        lambda: all(metric(p, "orchestrator_kv_blocks_used") == 0 for p in SYSTEM_PORTS),
        "the aborted request's KV blocks to be freed",
        REQUEST_TIMEOUT_S,
    )


def _stream_to_end(client: openai.OpenAI, prompt: str, started: threading.Event) -> str:
    """Stream one long request; its outcome: ``finished``, ``error: ...`` or
    ``ended without a finish reason``."""
    try:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=300,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        finish = None
        for chunk in stream:
            started.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    except openai.APIError as exc:
        return f"error: {exc}"
    finally:
        started.set()
    return "finished" if finish else "ended without a finish reason"


def test_a_killed_worker_fails_its_requests_and_the_survivor_serves(fleet: Fleet) -> None:
    outcomes: dict[int, str] = {}
    started = [threading.Event() for _ in range(4)]

    def run(index: int) -> None:
        prompt = f"Story {index}: tell a very long tale about lighthouse number {index * 7}."
        outcomes[index] = _stream_to_end(fleet.client, prompt, started[index])

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    for event in started:
        assert event.wait(REQUEST_TIMEOUT_S), "a stream never started"
    running = [metric(port, "orchestrator_num_requests_running") for port in SYSTEM_PORTS]
    waiting = [metric(port, "orchestrator_num_requests_waiting") for port in SYSTEM_PORTS]
    victim = running.index(max(running))
    assert running[victim] >= 1, running
    fleet.workers[victim].popen.kill()
    fleet.workers[victim].popen.wait(timeout=10)
    for thread in threads:
        thread.join(timeout=REQUEST_TIMEOUT_S)
        assert not thread.is_alive(), f"a request hung after its worker was killed: {outcomes}"
    failed = [o for o in outcomes.values() if o != "finished"]
    # The gauges were read just before the kill: the victim's running requests fail,
    # and so may the ones it had queued; the survivor's finish.
    load = (running, waiting, victim, outcomes)
    assert running[victim] <= len(failed) <= running[victim] + waiting[victim], load
    assert all(o.startswith("error: ") for o in failed), outcomes

    # New requests reach the survivor once the frontend has seen the worker go.
    survivor = SYSTEM_PORTS[1 - victim]
    before = metric(survivor, "orchestrator_prompt_tokens_total")
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    consecutive = 0
    while consecutive < 3:
        assert time.monotonic() < deadline, "requests kept failing after the worker died"
        try:
            fleet.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            consecutive += 1
        except openai.APIError:
            consecutive = 0
            time.sleep(1)
    assert metric(survivor, "orchestrator_prompt_tokens_total") > before
