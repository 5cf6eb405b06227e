"""Schemathesis against the gateway's own ``/openapi.json``, through a real uvicorn on
127.0.0.1 over the fake engine: schema-valid and schema-violating requests to every
operation. Checked for each response: no 5xx, a documented status, a documented media
type, a body (or each SSE event) matching the documented schema, and every
schema-violating request refused with a 4xx. Afterwards the engine still runs and holds
no KV block. The budget is bounded by example counts (about half a minute here)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from orchestrator.core import EngineCore
from tests.gateway.support import fake_config, fake_core, fake_loader, metric, running_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

EXAMPLES_PER_MODE = 250  # per operation and generation mode
REQUEST_TIMEOUT_S = 30
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, EngineCore]]:
    # Steps of half a millisecond: a choice that fills the 256-token context is quick.
    # Constrained requests are admitted, so generated ones with response_format or
    # forced tool calls reach generation as on a server whose executor enforces them.
    core, _ = fake_core(step_time_s=0.0005, accept_constraints=True)
    with running_server(fake_config(), fake_loader(core)) as (base, _):
        yield base, core


def plain_messages(case: schemathesis.Case) -> schemathesis.Case:
    """``case`` with its chat messages replaced by one user message. The schema gives
    every role one message shape, so nearly every generated list breaks a rule of its
    roles (a tool message without content, a tool_call_id on a user message) and is
    refused with a 400: 249 of 250 cases in one run, so the check that chat fuzzing
    reaches generation failed by chance. Half the chat cases keep their messages."""
    if isinstance(case.body, dict) and isinstance(case.body.get("messages"), list):
        case.body["messages"] = [{"role": "user", "content": "w1 w2"}]
    return case


def fuzz(base: str, operation: schemathesis.APIOperation, mode: GenerationMode) -> Counter[int]:
    """Run ``EXAMPLES_PER_MODE`` generated cases; the status codes seen."""
    statuses: Counter[int] = Counter()
    cases = operation.as_strategy(generation_mode=mode)
    if mode is GenerationMode.POSITIVE and operation.path == "/v1/chat/completions":
        cases = st.one_of(cases, cases.map(plain_messages))

    @settings(
        max_examples=EXAMPLES_PER_MODE,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases on every run
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=base, timeout=REQUEST_TIMEOUT_S)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    run()
    return statuses


def test_generated_requests_get_documented_answers_and_never_a_5xx(
    server: tuple[str, EngineCore],
) -> None:
    base, core = server
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    seen: dict[str, Counter[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        # Only the POST operations take input that can be violated.
        modes = [GenerationMode.POSITIVE]
        if operation.method.upper() == "POST":
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            seen[f"{operation.label} {mode.value}"] = fuzz(base, operation, mode)

    # The fuzzing reached generation, not only rejections.
    assert seen["POST /v1/completions positive"][200] > 0, seen
    assert seen["POST /v1/chat/completions positive"][200] > 0, seen
    assert set(seen["POST /v1/completions negative"]) <= {400, 404, 413}
    # The engine survived everything and leaked nothing.
    assert httpx.get(f"{base}/ready").status_code == 200
    deadline = time.monotonic() + 10
    while core.stats().kv_blocks_used or core.stats().num_running:
        assert time.monotonic() < deadline, core.stats()
        time.sleep(0.05)
    text = httpx.get(f"{base}/metrics").text
    assert metric(text, "orchestrator_kv_blocks_used") == 0
    ok = httpx.post(f"{base}/v1/completions", json={"prompt": "w1 w2", "max_tokens": 2})
    assert ok.status_code == 200
