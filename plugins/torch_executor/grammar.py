"""Constrained decoding for the torch executor, with llguidance.

llguidance (Microsoft's grammar engine behind Guidance; also a backend of vLLM, SGLang
and TensorRT-LLM) has no Python dependencies, runs on the CPU, parses lazily (an Earley
parser over a lexer built on demand, so no schema pays an exponential compile up front)
and computes a token mask in tens of microseconds; its ``LLParserLimits`` bound the work
any one grammar may cost, at compile and per token. It is imported here only, when an
executor is built with constraints on.

Three parts:

- ``load_tokenizer``: llguidance's view of the model's tokenizer (``LLTokenizer``), built
  once per executor from the tokenizer's ``tokenizer.json`` (cached beside the
  dequantised GGUF weights, since reading a GGUF tokenizer through transformers takes
  seconds), sized to the model's logits width.
- ``GrammarBackend``: the executor's ``ConstraintBackend``, for every ``ConstraintKind``
  (JSON schemas, regular expressions and Lark grammars, with ``%json{...}`` for
  embedded schemas, natively; a choice as a Lark alternation). ``compile`` turns a spec into
  an llguidance grammar and builds its matcher (the expensive part; llguidance drops the
  GIL meanwhile) on the engine's compile thread; the matcher is the handle the plan
  carries.
- ``Matchers``: the per-request matcher state of the running requests, and each step's
  mask: ``start`` fills the batch's token bitmask on a worker thread (llguidance drops
  the GIL) while the forward pass runs; ``apply`` waits for it and masks the logits
  before sampling; ``advance`` feeds each matcher its sampled token.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from orchestrator.core import (
    ConstraintError,
    ConstraintKind,
    ConstraintSpec,
    ModelConfig,
    ScheduledRequest,
)

if TYPE_CHECKING:
    import llguidance
    from llguidance._lib import JsonCompileOptions

log = logging.getLogger(__name__)

# The file the tokenizer's Hugging Face (``tokenizers``) JSON is cached as.
TOKENIZER_FILE = "tokenizer.json"
_SHIFTS = torch.arange(32, dtype=torch.int32)
# JSON as ``json.dumps`` writes it (", " and ": ", no other whitespace): flexible
# whitespace lets a small model fill its output with newlines before a value. A schema's
# own ``x-guidance`` options still apply on top.
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# What llguidance appends to an error with ``verbose_errors`` off.
_NON_VERBOSE = "<non-verbose/>"


def _limits() -> llguidance.LLParserLimits:
    """llguidance's resource bounds, at their defaults except ``verbose_errors`` off: an
    error then names the problem without echoing the parser state or the client's spec."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


def tokenizer_json(model: ModelConfig, cache_dir: Path) -> str:
    """The model's tokenizer as ``tokenizers`` JSON: the source folder's
    ``tokenizer.json``, else (a GGUF file) a copy cached in the dequantised weights'
    folder, written once from the tokenizer transformers reads out of the GGUF."""
    from orchestrator.common.model_source import load_tokenizer, resolve_source
    from plugins.torch_executor.weights import cache_folder_for

    source = resolve_source(model)
    if source.gguf_file is None:
        path = source.directory / TOKENIZER_FILE
        if path.exists():
            return path.read_text()
        return _backend_json(load_tokenizer(model))
    path = cache_folder_for(source, cache_dir) / TOKENIZER_FILE
    if path.exists():
        return path.read_text()
    text = _backend_json(load_tokenizer(model))
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed, so a crash never leaves half a file.
    fd, tmp = tempfile.mkstemp(prefix=".partial-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return text


def _backend_json(hf_tokenizer: Any) -> str:
    """A fast Hugging Face tokenizer's Rust tokenizer as JSON, without padding or
    truncation (what ``llguidance.hf.from_tokenizer`` does)."""
    from copy import copy

    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("constrained decoding needs a fast (Rust) Hugging Face tokenizer")
    backend = copy(backend)
    backend.no_padding()
    backend.no_truncation()
    text: str = backend.to_str()
    return text


def load_tokenizer(
    text: str, vocab_size: int, eos_token_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    """llguidance's tokenizer from ``tokenizers`` JSON ``text``, over ``vocab_size`` ids
    (the model's logits width, which may exceed the tokenizer's: the extra ids are never
    allowed) with the model's end-of-sequence ids (the only ids a complete grammar
    allows)."""
    import llguidance

    return llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(eos_token_ids))


def grammar_of(spec: ConstraintSpec) -> str:
    """llguidance's grammar text for ``spec``; ``ConstraintError`` for a value that is
    not what its kind needs (a schema that is not JSON, a choice that is not a list of
    strings)."""
    from llguidance import LLMatcher

    kind, value = spec.kind, spec.value
    try:
        if kind is ConstraintKind.JSON_OBJECT:
            return LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS)
        if kind is ConstraintKind.JSON_SCHEMA:
            schema = json.loads(value)
            if not isinstance(schema, dict | bool):
                raise ConstraintError("a JSON schema must be an object or a boolean")
            return LLMatcher.grammar_from_json_schema(json.dumps(schema), JSON_OPTIONS)
        if kind is ConstraintKind.REGEX:
            return LLMatcher.grammar_from_regex(value)
        if kind is ConstraintKind.CHOICE:
            choices = json.loads(value)
            if (
                not isinstance(choices, list)
                or not choices
                or not all(isinstance(c, str) and c for c in choices)
            ):
                raise ConstraintError("a choice must be a non-empty list of non-empty strings")
            return LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(c) for c in choices)
            )
        return LLMatcher.grammar_from_lark(value)
    except json.JSONDecodeError as err:
        raise ConstraintError(f"not valid JSON: {err}") from None
    except ValueError as err:
        if isinstance(err, ConstraintError):
            raise
        raise ConstraintError(str(err)) from None


class GrammarBackend:
    """Compiles specs against one tokenizer. Thread-safe: ``LLTokenizer`` is immutable,
    and each compile builds a matcher of its own."""

    def __init__(self, tokenizer: llguidance.LLTokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size: int = tokenizer.vocab_size
        self._limits = _limits()

    def compile(self, spec: ConstraintSpec) -> llguidance.LLMatcher:
        """A fresh matcher for ``spec``, at the start of the output; ``ConstraintError``
        naming the problem when it does not compile or exceeds the parser limits."""
        import llguidance

        matcher = llguidance.LLMatcher(
            self.tokenizer, grammar_of(spec), log_level=0, limits=self._limits
        )
        if matcher.is_error():
            raise ConstraintError(error_text(matcher))
        return matcher


@dataclass(slots=True)
class _State:
    """One request's matcher and the position (tokens before it) of the next token it
    expects: a sample at an earlier position rolls it back, none may come later."""

    matcher: llguidance.LLMatcher
    next_position: int


class PendingMask:
    """The mask of one step being filled: rows ``0..`` of ``bitmask`` belong to
    ``request_ids`` in order."""

    def __init__(
        self,
        request_ids: list[str],
        states: list[_State],
        bitmask: torch.Tensor,
        future: Future[None] | None,
        failed: dict[str, str],
    ) -> None:
        self.request_ids = request_ids
        self.states = states
        self.bitmask = bitmask
        self.future = future
        self.failed = failed


class Matchers:
    """The matchers of the executor's constrained requests, kept from a request's first
    sample to its finish (``forget``), through recompute preemption: its output tokens
    survive preemption, so its matcher stays where it was.

    ``vocab_size`` is the logits width (tokens); the mask has one bit per id.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._words = (vocab_size + 31) // 32
        self._states: dict[str, _State] = {}
        # One worker: the step's masks are filled in order, beside the forward pass.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")

    def __len__(self) -> int:
        return len(self._states)

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop the matchers of finished or aborted requests."""
        for rid in request_ids:
            self._states.pop(rid, None)

    def start(self, entries: Sequence[ScheduledRequest]) -> PendingMask:
        """Begin filling the mask of ``entries`` (each samples and carries a matcher as its
        ``constraint``) on the worker thread; returns at once."""
        ids: list[str] = []
        states: list[_State] = []
        failed: dict[str, str] = {}
        for s in entries:
            state, problem = self._state_for(s)
            if state is None:
                failed[s.request_id] = problem
                continue
            ids.append(s.request_id)
            states.append(state)
        bitmask = torch.empty(len(ids), self._words, dtype=torch.int32)
        future = self._pool.submit(_fill, [st.matcher for st in states], bitmask) if ids else None
        return PendingMask(ids, states, bitmask, future, failed)

    def _state_for(self, s: ScheduledRequest) -> tuple[_State | None, str]:
        state = self._states.get(s.request_id)
        position = s.context_len
        if state is None:
            state = self._states[s.request_id] = _State(s.constraint, position)  # type: ignore[arg-type]
        elif position < state.next_position:
            if not state.matcher.rollback(state.next_position - position):
                return None, f"constraint: cannot roll back to position {position}"
            state.next_position = position
        elif position > state.next_position:
            return None, (
                f"constraint: sampling position {position}, but the grammar has seen "
                f"tokens up to {state.next_position}"
            )
        if state.matcher.is_error():
            return None, f"constraint: {error_text(state.matcher)}"
        return state, ""

    def apply(self, pending: PendingMask, logits: torch.Tensor, rows: Sequence[int]) -> None:
        """Wait for ``pending``'s mask and set every token it forbids to ``-inf`` in
        ``logits`` (float32 ``[n, vocab]``); ``rows[i]`` is the logits row of
        ``pending.request_ids[i]``. A request left with no allowed token fails (into
        ``pending.failed``)."""
        if pending.future is None:
            return
        pending.future.result()
        # [n, words, 32] -> [n, words * 32]: bit j of word w allows token 32 * w + j.
        allowed = ((pending.bitmask.unsqueeze(-1) >> _SHIFTS) & 1).view(len(rows), -1)
        allowed = allowed[:, : logits.shape[1]].bool()
        usable = allowed.any(dim=1).tolist()
        for i, rid in enumerate(pending.request_ids):
            if not usable[i]:  # its row stays as it is; its token is dropped
                pending.failed[rid] = "constraint: the grammar allows no token here"
        keep = [i for i, ok in enumerate(usable) if ok]
        if keep:
            index = torch.tensor([rows[i] for i in keep], dtype=torch.int64)
            forbidden = ~allowed[torch.tensor(keep, dtype=torch.int64)]
            logits[index] = logits[index].masked_fill(forbidden, -torch.inf)

    def advance(self, pending: PendingMask, sampled: dict[str, int]) -> None:
        """Feed each matcher its request's sampled token; a token it refuses fails that
        request (into ``pending.failed``, and out of ``sampled``)."""
        for rid, state in zip(pending.request_ids, pending.states, strict=True):
            token = sampled.get(rid)
            if token is None or rid in pending.failed:
                continue
            if state.matcher.consume_token(token):
                state.next_position += 1
                continue
            error = error_text(state.matcher) or "not allowed"
            pending.failed[rid] = f"constraint: the sampled token {token} was refused: {error}"
            del sampled[rid]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._states.clear()


def error_text(matcher: llguidance.LLMatcher) -> str:
    """A matcher's error, without llguidance's non-verbose marker."""
    return matcher.get_error().replace(_NON_VERBOSE, "").strip()


def _fill(matchers: list[llguidance.LLMatcher], bitmask: torch.Tensor) -> None:
    """Write each matcher's allowed-token bitmask into its row of ``bitmask``
    (int32 ``[len(matchers), words]``, contiguous); llguidance drops the GIL meanwhile."""
    row_bytes = bitmask.shape[1] * 4
    base = bitmask.data_ptr()
    for i, matcher in enumerate(matchers):
        matcher.unsafe_compute_mask_ptr(base + i * row_bytes, row_bytes)
