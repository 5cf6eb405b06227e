"""Sampling: filters, seeded reproducibility independent of the batch, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.core.request import SamplingParams
from plugins.torch_executor.sampler import (
    NUCLEUS_CANDIDATES,
    Sampler,
    SampleRow,
    filtered_probs,
    inverse_cdf_draw,
    mix_seed,
    nucleus,
)


def sampler(seed: int = 0) -> Sampler:
    return Sampler(torch.Generator().manual_seed(seed))


def random_logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_picks_the_argmax() -> None:
    logits = random_logits(4)
    rows = [SampleRow(SamplingParams(temperature=0), 10)] * 4
    tokens, logprobs = sampler().sample(logits, rows)
    assert tokens == logits.argmax(-1).tolist()
    assert logprobs == [None] * 4


def test_greedy_takes_the_first_of_tied_maxima() -> None:
    """As ``argmax`` (and transformers' greedy search) does, on rows of many ties."""
    logits = torch.randint(0, 3, (64, 49152), generator=torch.Generator().manual_seed(1)).float()
    logits[5] = 0.0  # one row all tied: token 0
    rows = [SampleRow(SamplingParams(temperature=0), 10)] * 64
    tokens, _ = sampler().sample(logits, rows)
    first_max = [int((row == row.max()).nonzero()[0]) for row in logits]
    assert tokens == first_max and tokens[5] == 0


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    logits = random_logits(3)
    rows = [SampleRow(SamplingParams(temperature=5.0, top_k=1), p) for p in range(3)]
    assert sampler().sample(logits, rows)[0] == logits.argmax(-1).tolist()


def test_top_k_and_top_p_keep_exactly_the_expected_support() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.8)]
    probs = filtered_probs(logits, params)
    assert (probs[0] > 0).tolist() == [True, True, False, False]
    # Mass before token 3 is 0.95 >= 0.8, before token 2 it is 0.8 >= 0.8: both dropped.
    assert (probs[1] > 0).tolist() == [True, True, False, False]
    assert torch.allclose(probs[1, :2], torch.tensor([0.625, 0.375]))


def test_top_p_one_keeps_every_token_beside_a_filtered_row() -> None:
    # The second row makes the top-p path run; the first must come through untouched
    # even where the cumulative sum rounds past 1.
    logits = random_logits(2, vocab=1000)
    probs = filtered_probs(logits, [SamplingParams(top_p=1.0), SamplingParams(top_p=0.5)])
    assert torch.equal(probs[0], torch.softmax(logits[0], -1))
    assert 0 < int((probs[1] > 0).sum()) < 1000


def test_temperature_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.log(probs).repeat(4000, 1)
    rows = [SampleRow(SamplingParams(temperature=1.0), 0)] * 4000
    tokens = torch.tensor(sampler(seed=3).sample(logits, rows)[0])
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_inverse_cdf_draw_never_picks_a_filtered_token() -> None:
    """The extreme uniforms land on the first and last token of nonzero probability,
    and a uniform on a boundary goes to the token after it."""
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 4)
    uniforms = torch.tensor([0.0, 0.5, 0.25, 1.0 - 2.0**-53], dtype=torch.float64)
    assert inverse_cdf_draw(probs, uniforms).tolist() == [1, 3, 1, 3]
    # A row whose float32 sum falls short of 1 still never reaches its zero tail.
    short = torch.tensor([[0.3, 0.3, 0.0]])
    assert inverse_cdf_draw(
        short, torch.tensor([1.0 - 2.0**-53], dtype=torch.float64)
    ).tolist() == [1]


def full_sort_nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-p by sorting the whole vocabulary: the rule ``nucleus`` implements."""
    values, order = probs.sort(dim=-1, descending=True)
    drop = (values.cumsum(dim=-1) - values) >= top_p[:, None]
    drop[:, 0] = False
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(1, order, ~drop)


@pytest.mark.parametrize("scale", [0.001, 0.3, 3.0, 30.0])
def test_nucleus_from_the_likeliest_tokens_matches_a_full_sort(scale: float) -> None:
    """Peaked rows find their nucleus among the first candidates; flat ones need more
    than ``NUCLEUS_CANDIDATES`` tokens and widen the search."""
    vocab = 8 * NUCLEUS_CANDIDATES + 5
    probs = torch.softmax(random_logits(6, vocab=vocab, seed=4) * scale, dim=-1)
    top_p = torch.tensor([0.05, 0.3, 0.5, 0.9, 0.99, 0.999999])
    kept = nucleus(probs, top_p)
    reference = full_sort_nucleus(probs, top_p)
    for row in range(len(top_p)):
        # The likeliest tokens, as many as the full sort keeps (one more or fewer where
        # the mass lands on top_p within rounding: both sums run in float32).
        assert abs(int(kept[row].sum()) - int(reference[row].sum())) <= 1
        dropped = probs[row][~kept[row]]
        assert dropped.numel() == 0 or probs[row][kept[row]].min() >= dropped.max()
    if scale >= 3.0:
        assert torch.equal(kept, reference)
    if scale == 0.001:
        assert int(kept[3].sum()) > NUCLEUS_CANDIDATES  # the widened search ran


def test_seeded_rows_ignore_the_rest_of_the_batch() -> None:
    logits = random_logits(8, seed=1)
    mine = SampleRow(SamplingParams(temperature=1.0, seed=42), 17)
    alone = sampler(0).sample(logits[3:4], [mine])[0][0]
    others = [SampleRow(SamplingParams(temperature=1.0), p) for p in range(8)]
    batch = [*others[:3], mine, *others[4:]]
    for seed in range(5):
        assert sampler(seed).sample(logits, batch)[0][3] == alone


def test_seeded_draws_vary_with_position_and_seed() -> None:
    logits = torch.zeros(1, 1000)  # uniform: any repeat across 20 draws would be suspicious
    draws = {
        sampler().sample(logits, [SampleRow(SamplingParams(seed=s), p)])[0][0]
        for s, p in [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)] * 1
    }
    assert len(draws) == 5
    assert len({mix_seed(s, p) for s in range(50) for p in range(50)}) == 2500
    assert all(0 <= mix_seed(s, p) < 2**63 for s in (0, -1, 2**70) for p in (0, 9))


def test_logprobs_are_the_models_log_softmax_with_top_alternatives() -> None:
    logits = random_logits(2)
    rows = [
        SampleRow(SamplingParams(temperature=0, logprobs=3), 0),
        SampleRow(SamplingParams(temperature=0), 0),
    ]
    tokens, logprobs = sampler().sample(logits, rows)
    expected = torch.log_softmax(logits[0], -1)
    first = logprobs[0]
    assert first is not None and logprobs[1] is None
    assert math.isclose(first.logprob, expected[tokens[0]].item(), rel_tol=1e-6)
    assert [t for t, _ in first.top] == expected.topk(3).indices.tolist()
    assert first.top[0][1] >= first.top[1][1] >= first.top[2][1]


def test_rejects_mismatched_rows() -> None:
    with pytest.raises(ValueError, match="2 logit rows for 1 sample rows"):
        sampler().sample(random_logits(2), [SampleRow(SamplingParams(), 0)])
