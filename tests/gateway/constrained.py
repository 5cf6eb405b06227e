"""Test doubles for constrained requests: a byte-level tokenizer (so a fake engine can
write any text, JSON and tool calls included), and the real engine core over a scripted
executor, so the gateway meets the engine's contract for constraints:

1. an executor that cannot enforce constraints makes the engine refuse a constrained
   submission with ``AdmissionError`` naming the field (``enforces=False``);
2. a constraint that fails to compile ends the request before any token with
   ``finish_reason`` ERROR and ``error_code == "invalid_constraint"``
   (``compile_error``);
3. otherwise the output obeys the constraint: here it is a script the test chooses
   (``script``), checked against the constraint with llguidance by the tests.

``grammar_accepts`` compiles a constraint with llguidance over the same byte
vocabulary and says whether it accepts a text: the gateway never imports llguidance,
its tests do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from orchestrator.core import (
    ConstraintError,
    ConstraintKind,
    ConstraintSpec,
    SchedulerConfig,
    WallClock,
)
from orchestrator.core.engine import EngineCore
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import SchedulerOutput, StepResult
from orchestrator.core.request import Submission
from orchestrator.core.sched.constraints import ConstraintCompiles
from orchestrator.core.sched.scheduler import Scheduler
from tests.fakes import FakeExecutor

BYTE_EOS = 256
BYTE_VOCAB = 257


class ByteTokenizer:
    """Token ``b < 256`` is the byte ``b``; 256 ends a sequence. Chat renders as
    ``role: content`` lines, tools (where given) as JSON."""

    eos_token_ids: tuple[int, ...] = (BYTE_EOS,)
    vocab_size = BYTE_VOCAB

    def __init__(self, renders_tools: bool = False) -> None:
        self.renders_tools = renders_tools
        self.rendered: list[tuple[list[dict[str, Any]], Any]] = []  # what encode_chat saw

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        self.rendered.append(([dict(m) for m in messages], tools))
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        if tools:
            text = f"tools: {json.dumps(list(tools))}\n{text}"
        return self.encode(text + "assistant:")

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        data = bytes(t for t in token_ids if t < 256)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""


class ScriptedExecutor(FakeExecutor):
    """Samples each request's script, byte by byte, then end-of-sequence; a request
    without a script gets ``b"x"`` forever. As a ``ConstraintBackend`` it "compiles" a
    spec by asking ``compile_error``: a message is raised as the compile's failure."""

    def __init__(self, compile_error: Callable[[ConstraintSpec], str | None]) -> None:
        super().__init__(num_blocks=512, block_size=16, step_time_s=0.001)
        self.scripts: dict[str, bytes] = {}
        self.prompt_len: dict[str, int] = {}
        self._compile_error = compile_error

    def compile_constraint(self, spec: ConstraintSpec) -> object:
        error = self._compile_error(spec)
        if error is not None:
            raise ConstraintError(error)
        return spec

    def execute(self, plan: SchedulerOutput) -> StepResult:
        result = super().execute(plan)
        sampled = {}
        for s in plan.scheduled:
            if not s.sample:
                continue
            script = self.scripts.get(s.request_id)
            if script is None:
                sampled[s.request_id] = ord("x")
                continue
            position = s.context_len - self.prompt_len[s.request_id]
            sampled[s.request_id] = script[position] if position < len(script) else BYTE_EOS
        return StepResult(sampled, result.duration_s)


Script = Callable[[Submission], str | None]


class ConstrainedCore(EngineCore):
    """A real ``EngineCore`` (its constraint state and compile path included) over
    ``ScriptedExecutor``. ``script(submission)`` is the text a request writes;
    ``compile_error(spec)`` is the backend's message for a spec that fails to compile,
    or ``None``; with ``enforces=False`` the executor claims no constraint kind.
    ``submissions`` records what the gateway submitted."""

    def __init__(
        self,
        script: Script = lambda s: None,
        compile_error: Callable[[ConstraintSpec], str | None] = lambda spec: None,
        enforces: bool = True,
    ) -> None:
        self.executor_fake = ScriptedExecutor(compile_error)
        config = SchedulerConfig()
        kinds = frozenset(ConstraintKind) if enforces else frozenset()
        backend = self.executor_fake if enforces else None
        constraints = ConstraintCompiles(config.constraints, backend, kinds)
        kv = KVCacheManager(512, 16, True)
        scheduler = Scheduler(config, kv, 4096, None, constraints)
        super().__init__(scheduler, self.executor_fake, WallClock())
        self._script = script
        self.submissions: list[Submission] = []

    def add_request(self, submission: Submission) -> float | None:
        text = self._script(submission)
        if text is not None:
            self.executor_fake.scripts[submission.request_id] = text.encode()
        self.executor_fake.prompt_len[submission.request_id] = len(submission.prompt_token_ids)
        predicted = super().add_request(submission)
        self.submissions.append(submission)
        return predicted


def grammar_accepts(spec: ConstraintSpec, text: str) -> bool:
    """Whether llguidance, compiling ``spec`` as an executor would, accepts ``text``
    as a complete output (over the byte vocabulary of ``ByteTokenizer``)."""
    import llguidance
    from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

    class _Bytes:
        eos_token_id = BYTE_EOS
        bos_token_id = None
        tokens: ClassVar[list[bytes]] = [bytes([i]) for i in range(256)] + [b"<eos>"]
        special_token_ids: ClassVar[list[int]] = [BYTE_EOS]

        def __call__(self, data: bytes) -> list[int]:
            return list(data)

    kinds = {
        ConstraintKind.JSON_SCHEMA: ("json_schema", spec.value),
        ConstraintKind.JSON_OBJECT: ("json_schema", '{"type": "object"}'),
        ConstraintKind.REGEX: ("regex", spec.value),
        ConstraintKind.GRAMMAR: ("lark", spec.value),
    }
    if spec.kind is ConstraintKind.CHOICE:
        return text in json.loads(spec.value)
    kind, value = kinds[spec.kind]
    grammar = llguidance.grammar_from(kind, value)  # type: ignore[arg-type]
    problem = LLMatcher.validate_grammar(grammar)
    assert not problem, f"{spec.source}: the grammar does not compile: {problem}"
    matcher = LLMatcher(LLTokenizer(TokenizerWrapper(_Bytes())), grammar, log_level=0)
    matcher.consume_tokens(list(text.encode()))
    return not matcher.is_error() and matcher.is_accepting()
