"""Benchmark workloads: the exact requests a run sends, as a JSONL file.

A workload is a list of ``BenchRequest`` (prompt text, its length in tokens, and
``max_tokens``). It is written beside the results so that another server can be
measured with exactly the same requests (``--workload FILE``). Synthetic workloads take
their lengths from the simulator's distributions (``orchestrator.common.workloads``) with
the same seed streams, so a benchmark and a simulation of one seed see the same lengths;
the prompt text is a window of real text (``orchestrator.common.corpus``).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from pydantic import ValidationError

from orchestrator.bench.errors import BenchError
from orchestrator.bench.tokenizer import TextTokenizer
from orchestrator.common.corpus import token_prompts
from orchestrator.common.workloads import (
    FixedLength,
    LengthDist,
    LogNormalLength,
    UniformLength,
    WorkloadConfig,
    build_workload,
)
from orchestrator.core import format_errors


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request. ``prompt`` is sent as the completion prompt, or as the one user
    message of a chat request; ``num_prompt_tokens`` is its length by the benchmark's
    tokenizer (a server with another tokenizer may count differently); ``max_tokens``
    is the number of output tokens asked for."""

    request_id: str
    prompt: str
    num_prompt_tokens: int
    max_tokens: int


_FIELDS = tuple(f.name for f in fields(BenchRequest))

LENGTH_SYNTAX = "N, fixed:N, uniform:LOW:HIGH or lognormal:MEDIAN:SIGMA[:MAX]"


def parse_length(spec: str) -> FixedLength | UniformLength | LogNormalLength:
    """A length distribution (tokens) from its command-line form, ``LENGTH_SYNTAX``."""
    kind, _, rest = spec.partition(":")
    args = rest.split(":") if rest else []
    if not rest and kind.isdigit():
        kind, args = "fixed", [kind]
    try:
        if kind == "fixed" and len(args) == 1:
            return FixedLength(value=int(args[0]))
        if kind == "uniform" and len(args) == 2:
            return UniformLength(low=int(args[0]), high=int(args[1]))
        if kind == "lognormal" and len(args) in (2, 3):
            high = {"high": int(args[2])} if len(args) == 3 else {}
            return LogNormalLength(median=float(args[0]), sigma=float(args[1]), **high)
    except ValidationError as err:
        raise BenchError(f"length {spec!r}: {format_errors(err)}") from None
    except ValueError:
        raise BenchError(f"length {spec!r}: numbers expected; use {LENGTH_SYNTAX}") from None
    raise BenchError(f"length {spec!r}: use {LENGTH_SYNTAX}")


def synthetic_workload(
    tokenizer: TextTokenizer,
    num_requests: int,
    prompt_len: LengthDist,
    output_len: LengthDist,
    seed: int,
) -> list[BenchRequest]:
    """``num_requests`` prompts cut from the corpus at lengths drawn from ``prompt_len``
    and output lengths from ``output_len``; the same requests for the same seed.

    A window of token ids decoded to text may re-encode to a slightly different count;
    ``num_prompt_tokens`` is the re-encoded count, the length the server sees when it
    uses the same tokenizer.
    """
    if num_requests < 1:
        raise BenchError(f"--num-requests must be at least 1, got {num_requests}")
    specs = build_workload(
        WorkloadConfig(
            num_requests=num_requests, prompt_len=prompt_len, output_len=output_len, seed=seed
        )
    ).requests
    try:
        windows = token_prompts(tokenizer.encode, [s.prompt_len for s in specs], seed)
    except ValueError as err:
        raise BenchError(f"prompt lengths: {err}") from None
    requests = []
    for spec, window in zip(specs, windows, strict=True):
        text = tokenizer.decode(window)
        requests.append(
            BenchRequest(
                request_id=f"req-{spec.index:06d}",
                prompt=text,
                num_prompt_tokens=len(tokenizer.encode(text)),
                max_tokens=spec.output_len,
            )
        )
    return requests


def write_workload(path: Path, requests: list[BenchRequest]) -> None:
    """One JSON object per request, in sending order; ``read_workload`` reads it back
    equal."""
    with path.open("w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")


def read_workload(
    path: Path, tokenizer: TextTokenizer, output_len: LengthDist, seed: int
) -> list[BenchRequest]:
    """Read a workload file: a saved one, or a user's JSONL of prompts.

    Each line is an object with ``prompt`` (non-empty text) and optionally
    ``max_tokens``, ``num_prompt_tokens`` and ``request_id``. A missing ``max_tokens``
    is drawn from ``output_len`` (seeded, in file order); a missing
    ``num_prompt_tokens`` is counted with ``tokenizer``; a missing ``request_id`` is
    ``req-<line index>``. Unknown keys, bad values and duplicate ids are errors that
    name the file and line.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise BenchError(f"{path}: cannot read workload: {err.strerror}") from None
    rng = random.Random(f"{seed}:workload-output-len")
    requests: list[BenchRequest] = []
    seen: set[str] = set()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise BenchError(f"{where}: not JSON: {err.msg}") from None
        if not isinstance(obj, dict):
            raise BenchError(f"{where}: expected a JSON object with a 'prompt'")
        unknown = sorted(set(obj) - set(_FIELDS))
        if unknown:
            raise BenchError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {_FIELDS}")
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BenchError(f"{where}: 'prompt' must be non-empty text")
        request_id = obj.get("request_id", f"req-{len(requests):06d}")
        if not isinstance(request_id, str) or request_id in seen:
            raise BenchError(f"{where}: 'request_id' must be unique text, got {request_id!r}")
        seen.add(request_id)
        max_tokens = _positive_int(obj, "max_tokens", where, minimum=1)
        num_prompt = _positive_int(obj, "num_prompt_tokens", where, minimum=0)
        requests.append(
            BenchRequest(
                request_id=request_id,
                prompt=prompt,
                num_prompt_tokens=(
                    num_prompt if num_prompt is not None else len(tokenizer.encode(prompt))
                ),
                max_tokens=max_tokens if max_tokens is not None else output_len.sample(rng),
            )
        )
    if not requests:
        raise BenchError(f"{path}: the workload has no requests")
    return requests


def _positive_int(obj: dict[str, object], key: str, where: str, minimum: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    # bool is an int subclass; `true` is not a token count.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise BenchError(f"{where}: {key!r} must be an integer >= {minimum}, got {value!r}")
    return value
