"""One fresh serving engine, as ``make serve`` builds it, answering its very first
requests: ``python -m tests.e2e.first_request --dtype DTYPE --cache-dir DIR``, with
``ORCHESTRATOR_CPU_ISA`` choosing the kernel variant. Prints one JSON object: the
platform the executor resolved (``describe``) and the greedy tokens of four requests in
this order: the README's chat example, the same again, a second chat prompt, and the
README example once more; then, for eight more chat prompts, each answered twice in a row
(the second time on the prefix cache).

It runs in a process of its own so that nothing is warm: no kernel has run on any
thread, oneDNN and the CPU flash-attention kernel have compiled no shape, the KV pool
has never been written, and the intra-op thread pool is torch's default (one thread per
core), as in a served process (the e2e package's fixtures run on one thread).
``tests/e2e/test_first_request.py`` runs it once per kernel variant and dtype.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from orchestrator.common.model_source import load_tokenizer
from orchestrator.core.engine import EngineCore
from orchestrator.core.request import SamplingParams, Submission
from orchestrator.gateway.config import load_serve_config

SERVE_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "serve" / "smollm2-cpu.yaml"
README_CHAT = [{"role": "user", "content": "What is the capital of France?"}]
OTHER_CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]
# Prompts whose greedy answers in bfloat16 changed on the prefix cache before a prompt's
# last block attended as a cached continuation does (3 of 16 on an AMD EPYC with
# AVX512-BF16), and others.
REPEATED = [
    "How many legs does a spider have?",
    "What colour is the sky?",
    "Name a famous physicist.",
    "Who wrote Hamlet?",
    "What is 12 times 7?",
    "What do bees make?",
    "Which ocean is the biggest?",
    "Write a haiku about rain.",
]
MAX_TOKENS = 24


def chat_prompts() -> tuple[list[list[int]], list[list[int]]]:
    """The four first prompts and the repeated ones, as token ids rendered by the model's
    chat template as the gateway renders them (``tokenizer.encode_chat``)."""
    tokenizer = load_tokenizer(load_serve_config(SERVE_CONFIG).model)

    def render(messages: list[dict[str, str]]) -> list[int]:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))

    readme, other = render(README_CHAT), render(OTHER_CHAT)
    repeated = [render([{"role": "user", "content": q}]) for q in REPEATED]
    return [readme, readme, other, readme], repeated


def build_engine(dtype: str, cache_dir: str) -> EngineCore:
    """The serve config's engine, unedited but for the dtype, the weight cache and a
    small KV pool."""
    config = load_serve_config(SERVE_CONFIG)
    options = config.executor.options.model_copy(
        update={"dtype": dtype, "cache_dir": cache_dir, "kv_cache_gib": 0.05}
    )
    executor = config.executor.model_copy(update={"options": options})
    return EngineCore.from_config(config.model_copy(update={"executor": executor}))


def answer(engine: EngineCore, request_id: str, prompt: list[int]) -> list[int]:
    """Greedy tokens for ``prompt`` alone (no stop ids, so every answer has MAX_TOKENS)."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    engine.add_request(Submission(request_id, tuple(prompt), params))
    tokens: list[int] = []
    for _ in range(10 * MAX_TOKENS):
        if not engine.has_work():
            return tokens
        for out in engine.step().outputs:
            if out.error:
                raise RuntimeError(f"request {request_id} failed: {out.error}")
            tokens += out.new_token_ids
    raise RuntimeError(f"request {request_id} did not finish in {10 * MAX_TOKENS} steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], required=True)
    parser.add_argument("--cache-dir", required=True)
    args = parser.parse_args()
    prompts, repeated = chat_prompts()
    engine = build_engine(args.dtype, args.cache_dir)
    try:
        platform = dict(engine.executor.info().platform)
        answers = [answer(engine, f"r{i}", p) for i, p in enumerate(prompts)]
        repeats = [
            [answer(engine, f"p{i}-{j}", p) for j in range(2)] for i, p in enumerate(repeated)
        ]
    finally:
        engine.executor.shutdown()
    print(
        json.dumps(
            {"platform": platform, "prompts": prompts, "answers": answers, "repeats": repeats}
        )
    )


if __name__ == "__main__":
    main()
