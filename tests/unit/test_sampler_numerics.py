"""The torch sampler over every sampling setting the API accepts: probabilities stay
finite, every row keeps a token, and the chosen token is one the filters kept.

The settings are drawn from the gateway's own bounds (temperature 0..2 including
subnormal values, top_p in (0, 1] including values that round to 0 in float32, any
top_k, any seed, logprobs 0..20), and the logits from finite values at several scales,
with ties and a single-token vocabulary among them."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import SamplingParams
from orchestrator.gateway.protocol.shared import MAX_LOGPROBS, SEED_MAX, SEED_MIN, TOP_K_MAX
from plugins.torch_executor.sampler import MIN_TEMPERATURE, Sampler, SampleRow, filtered_probs

temperatures = st.one_of(
    st.just(0.0),
    st.floats(min_value=0.0, max_value=2.0, allow_subnormal=True),
    st.floats(min_value=0.0, max_value=2 * MIN_TEMPERATURE),
)
top_ps = st.one_of(
    st.just(1.0),
    st.floats(min_value=0.0, max_value=1.0, exclude_min=True, allow_subnormal=True),
)
top_ks = st.one_of(st.just(0), st.integers(1, 8), st.integers(0, TOP_K_MAX))
# The gateway wraps API seeds into 64 unsigned bits; executors see that range.
seeds = st.one_of(st.none(), st.integers(SEED_MIN, SEED_MAX).map(lambda s: s % 2**64))
params = st.builds(
    SamplingParams,
    temperature=temperatures,
    top_p=top_ps,
    top_k=top_ks,
    seed=seeds,
    logprobs=st.one_of(st.none(), st.integers(0, MAX_LOGPROBS)),
)


@st.composite
def logit_rows(draw: st.DrawFn) -> torch.Tensor:
    """``[rows, vocab]`` finite float32 logits: random at a drawn scale, or all tied."""
    rows = draw(st.integers(1, 4))
    vocab = draw(st.integers(1, 64))
    if draw(st.booleans()):
        scale = draw(st.sampled_from([0.0, 1e-3, 1.0, 30.0, 1e4]))
        seed = draw(st.integers(0, 2**31 - 1))
        return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    return torch.full((rows, vocab), draw(st.floats(-1e4, 1e4)))


@settings(max_examples=300, deadline=None)
@given(logits=logit_rows(), data=st.data())
def test_every_valid_setting_gives_finite_probabilities_and_a_kept_token(
    logits: torch.Tensor, data: st.DataObject
) -> None:
    rows = [
        SampleRow(data.draw(params), position=data.draw(st.integers(0, 10_000)))
        for _ in range(logits.shape[0])
    ]
    probs = filtered_probs(logits, [r.params for r in rows])
    assert bool(torch.isfinite(probs).all())
    assert torch.allclose(probs.sum(dim=-1), torch.ones(len(rows)), atol=1e-4)

    tokens, logprobs = Sampler(torch.Generator().manual_seed(0)).sample(logits, rows)
    vocab = logits.shape[-1]
    for i, (row, token) in enumerate(zip(rows, tokens, strict=True)):
        assert 0 <= token < vocab
        if row.params.temperature < MIN_TEMPERATURE:
            assert logits[i, token] == logits[i].max()  # greedy
        else:
            assert probs[i, token] > 0  # never a token the filters removed
        lp = logprobs[i]
        if row.params.logprobs is None:
            assert lp is None
        else:
            assert lp is not None and math.isfinite(lp.logprob)
            assert len(lp.top) == min(row.params.logprobs, vocab)
            assert all(math.isfinite(v) and 0 <= t < vocab for t, v in lp.top)


def test_top_p_that_rounds_to_zero_keeps_the_likeliest_token() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    probs = filtered_probs(logits, [SamplingParams(top_p=1e-300)])
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_a_subnormal_temperature_is_greedy() -> None:
    logits = torch.tensor([[0.5, 0.25, 2.0, 1.0]] * 3)
    rows = [SampleRow(SamplingParams(temperature=5e-324, seed=s), 1) for s in (None, 1, 2)]
    assert Sampler(torch.Generator().manual_seed(0)).sample(logits, rows)[0] == [2, 2, 2]
