"""What constrained decoding costs, on the default model through the real engine
in-process (``EngineCore`` with the torch executor built from
configs/serve/smollm2-cpu.yaml; no HTTP).

Two modes, both printing ratios against a baseline measured in the same run (medians
over alternating rounds):

- ``overhead`` (default): 16 concurrent requests with 0%, 50% and 100% of them under a
  JSON schema. Every request produces exactly ``--tokens`` tokens (the schema is an array
  of at least 1,000 integers, so it never completes early; unconstrained requests ignore
  EOS), so the runs differ only by the mask. Prints output tok/s and TPOT p50 per mix and
  their ratios to 0% (target: 100% >= 0.85x in tok/s).
- ``pathological``: 16 unconstrained streams alone, then the same 16 while pathological
  specs arrive every few steps (a schema nested 500 deep, which llguidance refuses; a
  huge enum over ``scheduler.constraints.max_spec_bytes``; a grammar that does not
  parse). Prints each bad spec's time to its ``invalid_constraint`` answer against the
  compile timeout, and the streams' TPOT p50 with them over without (target: <= 1.2x).

Run: PYTHONPATH=. .venv/bin/python benchmarks/structured_overhead.py [--mode overhead]
     [--rounds 3] [--tokens 32] [--concurrency 16] [--config configs/serve/smollm2-cpu.yaml]
The CPU the figures come from is printed first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.common.model_source import load_tokenizer
from orchestrator.core import (
    ConstraintKind,
    ConstraintSpec,
    EngineCore,
    SamplingParams,
    Submission,
    load_engine_config,
)
from orchestrator.core.executor import create_executor
from plugins.torch_executor.cpu_features import cpu_model, detect

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "serve" / "smollm2-cpu.yaml"
# Never complete before max_tokens: every request runs the same number of tokens.
LONG_ARRAY = {"type": "array", "items": {"type": "integer"}, "minItems": 1000}
PROMPT = "List as many whole numbers as you can, as a JSON array."
MAX_STEPS = 20_000  # bounds every engine loop


@dataclass
class Stream:
    """Token times (s, engine clock) of one request, and how it ended."""

    times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    error_code: str | None = None
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if len(self.times) < 2:
            return None
        return (self.times[-1] - self.times[0]) / (len(self.times) - 1)


def drive(
    engine: EngineCore,
    submissions: list[Submission],
    later: dict[int, list[Submission]] | None = None,
) -> tuple[dict[str, Stream], float]:
    """Submit ``submissions``, then step to the end, submitting ``later[k]`` before step
    ``k``; returns every request's stream and the wall time (s) of the run."""
    streams = {s.request_id: Stream() for s in submissions}
    start = time.perf_counter()
    for s in submissions:
        engine.add_request(s)
    later = later or {}
    submitted_at: dict[str, float] = {}
    for step_no in range(MAX_STEPS):
        for s in later.get(step_no, []):
            streams[s.request_id] = Stream()
            submitted_at[s.request_id] = engine.clock.now()
            engine.add_request(s)
        if not engine.has_work() and step_no > max(later, default=-1):
            break
        step = engine.step()
        at = step.start_time + step.duration_s
        for out in step.outputs:
            stream = streams[out.request_id]
            stream.times.extend([at] * len(out.new_token_ids))
            if out.finished:
                stream.finished_at = at - submitted_at.get(out.request_id, 0.0)
                stream.error_code = out.error_code
                stream.error = out.error
    return streams, time.perf_counter() - start


def mixed(prompt: tuple[int, ...], n: int, share: float, tokens: int, tag: str) -> list[Submission]:
    """``n`` requests of ``tokens`` tokens each, the first ``share`` of them under the
    long-array schema."""
    spec = ConstraintSpec(ConstraintKind.JSON_SCHEMA, json.dumps(LONG_ARRAY))
    n_constrained = round(n * share)
    params = SamplingParams(max_tokens=tokens, temperature=0)  # no stop ids: full length
    return [
        Submission(f"{tag}-{i}", prompt, params, constraint=spec if i < n_constrained else None)
        for i in range(n)
    ]


def overhead(engine: EngineCore, prompt: tuple[int, ...], args: argparse.Namespace) -> None:
    shares = (0.0, 0.5, 1.0)
    tok_s: dict[float, list[float]] = {s: [] for s in shares}
    tpot: dict[float, list[float]] = {s: [] for s in shares}
    for rnd in range(args.rounds + 1):  # round 0 warms up and is discarded
        for share in shares:
            subs = mixed(prompt, args.concurrency, share, args.tokens, f"r{rnd}-{share}")
            streams, wall = drive(engine, subs)
            total = sum(len(s.times) for s in streams.values())
            assert total == args.concurrency * args.tokens, total
            if rnd:
                tok_s[share].append(total / wall)
                tpot[share].append(statistics.median(s.tpot_s or 0.0 for s in streams.values()))
    base_tok, base_tpot = statistics.median(tok_s[0.0]), statistics.median(tpot[0.0])
    print(f"{'structured':>10} {'tok/s':>8} {'x base':>7} {'TPOT p50 ms':>12} {'x base':>7}")
    for share in shares:
        t, p = statistics.median(tok_s[share]), statistics.median(tpot[share])
        print(
            f"{share:>10.0%} {t:>8.1f} {t / base_tok:>7.3f} {p * 1e3:>12.1f} {p / base_tpot:>7.3f}"
        )
    ratio = statistics.median(tok_s[1.0]) / base_tok
    print(
        f"headline: 100% structured output tok/s = {ratio:.3f}x unconstrained at "
        f"{args.concurrency} concurrent ({'meets' if ratio >= 0.85 else 'misses'} >= 0.85x)"
    )


def pathological_specs(max_spec_bytes: int) -> list[tuple[str, ConstraintSpec]]:
    deep: dict[str, object] = {"type": "string"}
    for _ in range(500):
        deep = {"type": "array", "items": deep}
    n = max_spec_bytes // 8 + 1
    enum = {"enum": [f"v{i:07d}" for i in range(n)]}
    return [
        ("nested 500 deep", ConstraintSpec(ConstraintKind.JSON_SCHEMA, json.dumps(deep))),
        (f"enum of {n:,}", ConstraintSpec(ConstraintKind.JSON_SCHEMA, json.dumps(enum))),
        ("unparsable grammar", ConstraintSpec(ConstraintKind.GRAMMAR, "start: (", "tools")),
    ]


def pathological(
    engine: EngineCore, prompt: tuple[int, ...], args: argparse.Namespace, timeout_s: float
) -> None:
    limit = engine.scheduler.constraints.config.max_spec_bytes
    bad = pathological_specs(limit)
    alone: list[float] = []
    with_bad: list[float] = []
    answers: dict[str, list[float]] = {name: [] for name, _ in bad}
    reasons: dict[str, str] = {}
    for rnd in range(args.rounds + 1):
        for attack in (False, True):
            subs = mixed(prompt, args.concurrency, 0.0, args.tokens, f"p{rnd}-{attack}")
            later: dict[int, list[Submission]] = {}
            if attack:  # one of each, every 4 steps from the 2nd
                for k, (name, spec) in enumerate(bad * 3):
                    rid = f"bad{rnd}-{k}-{name}"
                    later.setdefault(2 + 4 * k, []).append(
                        Submission(rid, prompt, SamplingParams(max_tokens=8), constraint=spec)
                    )
            streams, _ = drive(engine, subs, later)
            tpot = statistics.median(streams[s.request_id].tpot_s or 0.0 for s in subs)
            if rnd:
                (with_bad if attack else alone).append(tpot)
                for rid, stream in streams.items():
                    if rid.startswith("bad"):
                        assert stream.error_code == "invalid_constraint", (rid, stream)
                        assert stream.finished_at is not None
                        name = rid.split("-", 2)[2]
                        answers[name].append(stream.finished_at)
                        reasons.setdefault(name, (stream.error or "")[:90])
    for name, times in answers.items():
        print(
            f"{name:>22}: invalid_constraint after {max(times) * 1e3:,.1f} ms at most "
            f"(timeout {timeout_s:g} s, polled once a step): {reasons.get(name, '')}"
        )
    a, w = statistics.median(alone), statistics.median(with_bad)
    print(
        f"TPOT p50 of {args.concurrency} unconstrained streams: alone {a * 1e3:.1f} ms, "
        f"with pathological specs arriving {w * 1e3:.1f} ms"
    )
    print(
        f"headline: TPOT p50 with/without = {w / a:.3f}x ({'meets' if w / a <= 1.2 else 'misses'} "
        "<= 1.2x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("overhead", "pathological"), default="overhead")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    config = load_engine_config(args.config)
    print(
        f"CPU: {cpu_model()} ({' '.join(detect().names())}); in-process EngineCore, "
        f"torch executor, {args.config.name}"
    )
    engine = EngineCore.from_config(config, executor=create_executor(config))
    tokenizer = load_tokenizer(config.model)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True
    )
    prompt = tuple(int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids))
    if args.mode == "overhead":
        overhead(engine, prompt, args)
    else:
        pathological(engine, prompt, args, config.scheduler.constraints.compile_timeout_s)
    engine.shutdown()


if __name__ == "__main__":
    main()
