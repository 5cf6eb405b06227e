"""Constrained decoding on the default model through the real engine: every kind's
output obeys it, a refused token fails only its request, and preemption by recompute
keeps the output valid."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
import torch

from orchestrator.core import (
    ConstraintKind,
    ConstraintSpec,
    FinishReason,
    ScheduledRequest,
    SchedulerOutput,
    Submission,
)
from plugins.torch_executor import TorchExecutor
from plugins.torch_executor.grammar import GrammarBackend
from plugins.torch_executor.weights import LlamaWeights
from tests.e2e.constrained import (
    chat_prompt,
    constrained_engine,
    grammar_backend,
    run,
    sampling,
    text_of,
)
from tests.factories import plan_entry

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
PHONE = r"[0-9]{3}-[0-9]{4}"
CHOICES = ["positive", "negative"]
# A tool call in llguidance's Lark: a name, then the arguments as an embedded schema.
CALL = (
    'start: "call " NAME " " args\n'
    "NAME: /[a-z_]{1,12}/\n"
    'args: %json{"type": "object", "properties": {"x": {"type": "integer"}}, '
    '"required": ["x"], "additionalProperties": false}\n'
)


@pytest.fixture(scope="module")
def backend(weights_f32: LlamaWeights, cache_dir: Path) -> GrammarBackend:
    return grammar_backend(weights_f32, cache_dir)


def specs() -> dict[str, tuple[ConstraintSpec, str]]:
    return {
        "json": (ConstraintSpec(ConstraintKind.JSON_SCHEMA, json.dumps(PERSON)), "A person?"),
        "regex": (ConstraintSpec(ConstraintKind.REGEX, PHONE, "structured_outputs.regex"), "Tel?"),
        "choice": (
            ConstraintSpec(ConstraintKind.CHOICE, json.dumps(CHOICES), "structured_outputs"),
            "Is 'I love it' positive or negative?",
        ),
        "grammar": (ConstraintSpec(ConstraintKind.GRAMMAR, CALL, "tools"), "Call a function."),
        "object": (ConstraintSpec(ConstraintKind.JSON_OBJECT, ""), "Any JSON object."),
    }


def check(name: str, text: str) -> None:
    """``text`` obeys the constraint ``specs()[name]``."""
    if name == "json":
        jsonschema.validate(json.loads(text), PERSON)
    elif name == "regex":
        assert re.fullmatch(PHONE, text), text
    elif name == "choice":
        assert text in CHOICES
    elif name == "grammar":
        match = re.fullmatch(r"call ([a-z_]{1,12}) (.*)", text, re.S)
        assert match, text
        assert isinstance(json.loads(match[2])["x"], int)
    else:
        assert isinstance(json.loads(text), dict)


def test_every_kind_is_obeyed_greedy_and_seeded(
    weights_f32: LlamaWeights, backend: GrammarBackend, tokenizer: Any
) -> None:
    engine = constrained_engine(weights_f32, backend)
    eos = weights_f32.args.eos_token_ids
    subs = []
    for name, (spec, prompt) in specs().items():
        ids = chat_prompt(tokenizer, prompt)
        greedy = sampling(48, eos, temperature=0)
        subs.append(Submission(name, ids, greedy, constraint=spec))
        seeded = sampling(48, eos, temperature=1.0, seed=7)
        subs.append(Submission(f"{name}-sampled", ids, seeded, constraint=spec))
    subs.append(Submission("plain", chat_prompt(tokenizer, "hi"), sampling(8, eos, temperature=0)))
    done = run(engine, subs)
    for sub in subs:
        result = done[sub.request_id]
        assert result.error is None, (sub.request_id, result.error)
        if sub.constraint is None:
            continue
        name = sub.request_id.removesuffix("-sampled")
        if result.reason is FinishReason.STOP:
            assert result.tokens[-1] in eos  # only EOS once the grammar is complete
            check(name, text_of(tokenizer, result))
        else:  # cut off by max_tokens: a sampled small model may ramble inside a string
            assert result.reason is FinishReason.LENGTH and len(result.tokens) == 48
    # Greedy, the bounded kinds complete (any JSON object may nest on past 48 tokens).
    bounded = ("json", "regex", "choice", "grammar")
    assert all(done[n].reason is FinishReason.STOP for n in bounded), {
        n: done[n].reason for n in bounded
    }
    engine.shutdown()


def test_max_tokens_cuts_a_constrained_output_with_length(
    weights_f32: LlamaWeights, backend: GrammarBackend, tokenizer: Any
) -> None:
    engine = constrained_engine(weights_f32, backend)
    spec = specs()["json"][0]
    ids = chat_prompt(tokenizer, "A person?")
    done = run(engine, [Submission("cut", ids, sampling(3, (2,), temperature=0), constraint=spec)])
    assert done["cut"].reason is FinishReason.LENGTH and len(done["cut"].tokens) == 3
    assert text_of(tokenizer, done["cut"]).startswith("{")
    engine.shutdown()


def test_a_bad_spec_ends_before_any_token_and_others_run(
    weights_f32: LlamaWeights, backend: GrammarBackend, tokenizer: Any
) -> None:
    engine = constrained_engine(weights_f32, backend)
    ids = chat_prompt(tokenizer, "hi")
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(500):  # llguidance refuses nesting this deep
        deep = {"type": "array", "items": deep}
    subs = [
        Submission(
            "deep",
            ids,
            sampling(8, (2,)),
            constraint=ConstraintSpec(ConstraintKind.JSON_SCHEMA, json.dumps(deep)),
        ),
        Submission(
            "lark",
            ids,
            sampling(8, (2,)),
            constraint=ConstraintSpec(ConstraintKind.GRAMMAR, "start: foo(", "tools"),
        ),
        Submission("plain", ids, sampling(4, (2,), temperature=0)),
    ]
    done = run(engine, subs)
    for rid in ("deep", "lark"):
        assert done[rid].reason is FinishReason.ERROR and not done[rid].tokens
        assert done[rid].error_code == "invalid_constraint"
    assert done["deep"].error is not None
    assert done["deep"].error.startswith("response_format: the JSON schema did not compile:")
    assert done["lark"].error is not None
    assert done["lark"].error.startswith("tools: the grammar did not compile:")
    assert done["plain"].reason in (FinishReason.STOP, FinishReason.LENGTH)
    engine.shutdown()


def test_a_token_the_matcher_refuses_fails_only_that_request(
    weights_f32: LlamaWeights, backend: GrammarBackend
) -> None:
    executor = TorchExecutor(weights_f32, block_size=16, num_blocks=32, seed=0, grammar=backend)
    regex = ConstraintSpec(ConstraintKind.REGEX, "[0-9]+")
    broken, healthy = backend.compile(regex), backend.compile(regex)
    letter = backend.tokenizer.tokenize_str("x")[0]
    assert not broken.consume_token(letter)  # its matcher is now in its error state

    def entry(rid: str, blocks: list[int], handle: object) -> ScheduledRequest:
        return plan_entry(
            rid, [1, 2, 3], 0, blocks, True, sampling(4, (2,), temperature=0), constraint=handle
        )

    plan = SchedulerOutput(
        [entry("broken", [0], broken), entry("healthy", [1], healthy), entry("plain", [2], None)]
    )
    result = executor.execute(plan)
    assert set(result.failed) == {"broken"} and "constraint" in result.failed["broken"]
    assert set(result.sampled) == {"healthy", "plain"}
    assert backend.tokenizer.decode_str([result.sampled["healthy"]]).isdigit()
    # The advance step refuses a token too: feed the healthy matcher a letter directly.
    matchers = executor.runner.matchers
    assert matchers is not None
    pending = matchers.start(
        [msgspec.structs.replace(entry("healthy", [1], healthy), start_position=1)]
    )
    matchers.apply(pending, torch.zeros(1, weights_f32.args.vocab_size), [0])
    sampled = {"healthy": letter}
    matchers.advance(pending, sampled)
    assert "healthy" in pending.failed and "refused" in pending.failed["healthy"]
    assert sampled == {}
    executor.shutdown()


def test_preemption_by_recompute_keeps_constrained_output_valid(
    weights_f32: LlamaWeights, backend: GrammarBackend, tokenizer: Any
) -> None:
    """A constrained request preempted part-way through its output by a better-priority
    one (a batch of one) resumes by recompute: its output is the one it produces alone
    (greedy), and valid."""
    eos = weights_f32.args.eos_token_ids
    spec = specs()["json"][0]
    low = Submission(
        "low",
        chat_prompt(tokenizer, "A person?"),
        sampling(40, eos, temperature=0),
        priority=5,
        constraint=spec,
    )
    high = Submission(
        "high",
        chat_prompt(tokenizer, "Another person?"),
        sampling(40, eos, temperature=0),
        priority=0,
        constraint=spec,
    )
    alone = {}
    for sub in (low, high):
        engine = constrained_engine(weights_f32, backend)
        alone.update(run(engine, [sub]))
        engine.shutdown()
    engine = constrained_engine(weights_f32, backend, policy="priority", max_batch_size=1)
    engine.add_request(low)
    early: list[int] = []
    for _ in range(200):  # until "low" is part-way through its output
        early += [t for o in engine.step().outputs for t in o.new_token_ids]
        if len(early) >= 6:
            break
    assert len(early) >= 6
    rest = run(engine, [high])
    assert engine.scheduler.num_preemptions > 0
    assert rest["high"].tokens == alone["high"].tokens
    assert early + rest["low"].tokens == alone["low"].tokens
    assert rest["low"].reason is alone["low"].reason
    if alone["low"].reason is FinishReason.STOP:
        jsonschema.validate(json.loads(text_of(tokenizer, alone["low"])), PERSON)
    engine.shutdown()
