"""Structured-output and tool-calling clients work unmodified: the request bodies
LangChain's ``with_structured_output`` (both methods) and LlamaIndex's function calling
send (``data/structured_client_bodies/``, sources in its README) are accepted, their
constraint accepts what the fake model writes, and the answer has the shape each
client parses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from orchestrator.core import Submission
from orchestrator.gateway.app import create_app
from orchestrator.gateway.config import ServeConfig
from orchestrator.gateway.lifecycle import LoadedModel
from tests.gateway.constrained import ByteTokenizer, ConstrainedCore, grammar_accepts
from tests.gateway.support import sse_events, wait_until

pytestmark = pytest.mark.timeout(120)

MODEL = "byte-model"
FOLDER = Path(__file__).parent / "data" / "structured_client_bodies"
BODIES = sorted(FOLDER.glob("*.json"))
WRITES: dict[str, str] = {}  # request id prefix -> what the model writes


def _load(path: Path) -> dict[str, Any]:
    case: dict[str, Any] = json.loads(path.read_text().replace('"$MODEL"', json.dumps(MODEL)))
    return case


def _script(submission: Submission) -> str | None:
    return WRITES.get("current")


@pytest.fixture(scope="module")
def core() -> ConstrainedCore:
    return ConstrainedCore(_script)


@pytest.fixture(scope="module")
def client(core: ConstrainedCore) -> Iterator[TestClient]:
    config = ServeConfig.model_validate(
        {"model": {"name": MODEL, "max_model_len": 8192}, "executor": {"type": "sim"}}
    )
    with TestClient(create_app(config, lambda: LoadedModel(core, ByteTokenizer()), {})) as c:
        wait_until(lambda: c.get("/ready").status_code == 200)
        yield c


def test_every_fixture_names_its_source() -> None:
    assert len(BODIES) >= 4
    readme = (FOLDER / "README.md").read_text()
    assert all(f"`{p.name}`" in readme for p in BODIES)


def _message(client: TestClient, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason, joined from the stream if it streams."""
    if not body.get("stream"):
        r = client.post(path, json=body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["message"], choice["finish_reason"]
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        events = [json.loads(e) for e in sse_events(r.iter_lines()) if e != "[DONE]"]
    content, calls, finish = "", {}, ""
    for event in events:
        for choice in event["choices"]:
            content += choice["delta"].get("content") or ""
            for piece in choice["delta"].get("tool_calls", []):
                call = calls.setdefault(piece["index"], {"function": {"name": "", "arguments": ""}})
                call["id"] = piece.get("id", call.get("id"))
                call["function"]["name"] += piece["function"].get("name", "")
                call["function"]["arguments"] += piece["function"].get("arguments", "")
            finish = choice["finish_reason"] or finish
    message = {"content": content or None, "tool_calls": [calls[i] for i in sorted(calls)]}
    return message, finish


@pytest.mark.parametrize("fixture", BODIES, ids=[p.stem for p in BODIES])
def test_structured_client_bodies_are_answered_in_shape(
    client: TestClient, core: ConstrainedCore, fixture: Path
) -> None:
    case = _load(fixture)
    body = case["body"]
    WRITES["current"] = case["model_writes"]
    message, finish = _message(client, case["path"], body)
    spec = core.submissions[-1].constraint
    if spec is not None:  # tool_choice auto is parsed, not constrained
        assert grammar_accepts(spec, case["model_writes"]), spec.source
    if "response_format" in body:
        assert spec is not None and finish == "stop"
        schema = body["response_format"]["json_schema"]["schema"]
        jsonschema.validate(json.loads(message["content"]), schema)
        return
    assert finish == "tool_calls"
    assert message["content"] is None
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    calls = message["tool_calls"]
    assert len(calls) == 1  # every fixture turns parallel calls off
    name = calls[0]["function"]["name"]
    assert calls[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), schemas[name])
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        assert name == choice["function"]["name"]
