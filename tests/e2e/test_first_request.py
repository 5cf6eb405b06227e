"""The first answers of a freshly started engine, on every kernel variant and dtype this
CPU runs: each in a new process (``tests/e2e/first_request.py``), with torch's default
thread pool, as ``make serve`` runs.

A state that only the first calls see (a tile configuration, a packed-weight reorder, a
kernel compiled on first use, a pool never written) shows as a first answer unlike the
same request sent again, or unlike the float32 reference:

- the README's example answered first equals, token for token, the same request sent
  again (which runs on the prefix cache) and sent a third time after another prompt;
  and so does each of eight more prompts answered twice (the prefix cache must never
  change a greedy answer);
- each answer, read up to its first end-of-turn token (the text a client gets), agrees with transformers' float32 greedy tokens on the same prompt, except
  where the reference itself was within the bfloat16 model's logit error of a tie (1.0,
  the bar in ``test_weight_formats.py``): from the first such point on, the two may
  part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from plugins.torch_executor import kernel_build
from plugins.torch_executor.cpu_features import detect
from plugins.torch_executor.precision import resolve_dtype
from tests.e2e.generation import reference_greedy
from tests.e2e.models import smollm_folder

pytestmark = pytest.mark.slow

TIE_GAP = 1.0  # the bfloat16 model's largest logit error against float32 on this model
END_OF_TURN = 2  # SmolLM2's <|im_end|>
TIMEOUT_S = 900  # one fresh process: model load, kernel build, four short requests


def cases() -> list[tuple[str, str]]:
    """(variant, dtype) pairs this CPU runs: each variant with ``dtype: auto`` and, where
    auto picks float32 but the variant accepts bfloat16, with bfloat16 too."""
    features = detect()
    out: list[tuple[str, str]] = []
    for variant in kernel_build.runnable(features):
        out.append((variant.name, "auto"))
        effective = kernel_build.effective(features, variant.name)
        try:
            auto, _ = resolve_dtype("auto", "cpu", effective)
            resolve_dtype("bfloat16", "cpu", effective)
        except ValueError:
            continue
        if auto != "bfloat16":
            out.append((variant.name, "bfloat16"))
    return out


def fresh_engine_answers(variant: str, dtype: str, cache_dir: Path) -> dict[str, Any]:
    """What ``first_request.py`` printed, run fresh on ``variant`` with ``dtype``."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.first_request", "--dtype", dtype,
         "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, kernel_build.ISA_ENV: variant},
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def visible(tokens: list[int]) -> list[int]:
    """The answer a client reads: up to and including the first end-of-turn token."""
    return tokens[: tokens.index(END_OF_TURN) + 1] if END_OF_TURN in tokens else tokens


def assert_agrees_up_to_a_tie(ours: list[int], tokens: list[int], logits: torch.Tensor) -> None:
    """``ours`` equals the reference's ``tokens`` up to its first end of turn, or parts
    from them only where the reference's top two logits were within ``TIE_GAP``. An
    answer with no end of turn was cut by its token limit: only that many are compared."""
    want = visible(tokens)
    if END_OF_TURN not in ours:
        want = want[: len(ours)]
    for t, expected in enumerate(want):
        if t >= len(ours) or ours[t] != expected:
            top2 = logits[t].topk(2).values
            gap = (top2[0] - top2[1]).item()
            assert gap < TIE_GAP, (
                f"position {t}: ours {ours[t : t + 8]}, reference {want[t : t + 8]}; the "
                f"reference's top-2 gap {gap:.3f} is no tie"
            )
            return


@pytest.fixture(scope="module")
def weights_ready(cache_dir: Path) -> Path:
    """The dequantised weights, cached once before the fresh processes read them."""
    smollm_folder(cache_dir)
    return cache_dir


@pytest.mark.parametrize(("variant", "dtype"), cases())
def test_the_first_answers_of_a_fresh_engine_are_right(
    variant: str, dtype: str, weights_ready: Path, reference: Any
) -> None:
    run = fresh_engine_answers(variant, dtype, weights_ready)
    assert run["platform"]["kernels"] == variant, run["platform"]
    first, again, other, third = run["answers"]
    assert first == again == third, (first, again, third, run["platform"])
    for i, (alone, on_cache) in enumerate(run["repeats"]):
        assert alone == on_cache, (i, alone, on_cache, run["platform"])
    readme, _, other_prompt, _ = run["prompts"]
    first, other = visible(first), visible(other)
    assert_agrees_up_to_a_tie(first, *reference_greedy(reference, readme, END_OF_TURN))
    assert_agrees_up_to_a_tie(other, *reference_greedy(reference, other_prompt, END_OF_TURN))
