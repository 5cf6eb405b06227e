"""Token selection: greedy, temperature, top-k, top-p, per-request seeds, logprobs.

Batch invariance: every row is transformed on its own (the vectorised filters never mix
rows) and a seeded row takes its one uniform draw from a hash of ``(seed, position)``,
so a request's choice depends only on its own logits, parameters and position, whatever
else shares the step, and stays the same after a preemption recomputes the request.

A sampled row is drawn by inverting its cumulative distribution (one uniform per row,
the cumulative sum in float64), not by a race of one noise draw per vocabulary entry:
at 64 rows of SmolLM2's 49,152 logits on 2 threads the noise alone took 53 ms, a
decode step's worth; the cumulative sum takes about 3 ms, and the CPU kernels' one pass
per row (rows without top-k or top-p) about 1.4 for all 64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from orchestrator.core import SamplingParams, TokenLogprobs

if TYPE_CHECKING:
    from plugins.torch_executor.native import Kernels

_MASK64 = (1 << 64) - 1
# Temperatures below this sample greedily: logits divided by a smaller one can overflow
# float32 to inf (and inf - inf is NaN in the softmax), while the distribution they
# describe is already one-hot to float32 precision.
MIN_TEMPERATURE = 1e-5


def is_greedy(params: SamplingParams) -> bool:
    """Whether ``params`` pick the argmax: temperature 0, or below ``MIN_TEMPERATURE``."""
    return params.temperature < MIN_TEMPERATURE


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One request that samples this step: its parameters and the position the new
    token will take (tokens before it: ``position``)."""

    params: SamplingParams
    position: int


def mix_seed(seed: int, position: int) -> int:
    """A 63-bit generator seed from ``(seed, position)`` (splitmix64 finaliser), so nearby
    seeds and positions give unrelated streams."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def seeded_uniform(seed: int, position: int) -> float:
    """A uniform draw in [0, 1) that depends only on ``(seed, position)``: the top 53 bits
    of ``mix_seed`` (a float64's precision)."""
    return (mix_seed(seed, position) >> 10) / 2.0**53


def inverse_cdf_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token ids ``[rows]`` drawn from ``probs`` ``[rows, vocab]`` (each row summing to
    about 1, filtered-out tokens at exactly 0) by their float64 ``uniforms`` ``[rows]``:
    the first token whose cumulative probability exceeds ``u`` times the row's total.

    The pick always has nonzero probability: its cumulative sum rises past the target,
    and the target stays below the row's total (clamped one step under it, for a ``u``
    whose product rounds up to the total)."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    below_total = torch.nextafter(total, torch.zeros_like(total))
    target = torch.minimum(uniforms.to(cdf.device)[:, None] * total, below_total)
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


class Sampler:
    """Picks one token per row of float32 logits ``[rows, vocab]``.

    Unseeded sampled rows draw from ``rng`` (one generator per executor), so they are
    random but not reproducible; seeded rows never touch it.
    """

    def __init__(self, rng: torch.Generator, kernels: Kernels | None = None) -> None:
        self.rng = rng
        self.kernels = kernels

    def sample(
        self, logits: torch.Tensor, rows: Sequence[SampleRow]
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        """Return the chosen token of every row and, for rows that asked, its logprobs.

        Logprobs are of the model's distribution (log-softmax of the raw logits), before
        temperature and filtering, as the OpenAI API reports them.
        """
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sample rows")
        random_rows = [i for i, r in enumerate(rows) if not is_greedy(r.params)]
        if len(random_rows) == len(rows):  # no greedy row, no copy of the logits
            tokens = self._draw(logits, rows).tolist()
            return tokens, self._logprobs(logits, rows, tokens)
        # [rows]; greedy rows keep this. ``max`` gives the same first index of the
        # maximum as ``argmax`` and ran 2.5x faster here (0.8 against 2.0 ms at 64 rows
        # of SmolLM2's 49,152 logits).
        chosen = logits.max(dim=-1).indices
        if random_rows:
            idx = torch.tensor(random_rows)
            chosen[idx] = self._draw(logits[idx], [rows[i] for i in random_rows]).to(chosen.device)
        tokens = chosen.tolist()
        return tokens, self._logprobs(logits, rows, tokens)

    def _draw(self, logits: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
        """A token id per row of ``logits`` ``[rows, vocab]``, every row sampling. Rows
        with no top-k or top-p on the CPU kernels draw in one pass over their logits
        (``Kernels.sample_rows``: 64 rows of 49,152 in about 1.5 ms on 2 threads of an
        Intel Xeon with AMX, against about 7 through torch's softmax and cumulative sum);
        the others through ``filtered_probs`` and ``inverse_cdf_draw``."""
        uniforms = self._uniforms(rows)
        vocab = logits.shape[-1]
        if (
            self.kernels is not None
            and logits.device.type == "cpu"
            and logits.dtype == torch.float32
            and all(r.params.top_p >= 1 and not 0 < r.params.top_k < vocab for r in rows)
        ):
            inv_temps = torch.tensor(
                [1.0 / max(r.params.temperature, MIN_TEMPERATURE) for r in rows],
                dtype=torch.float32,
            )
            return self.kernels.sample_rows(logits, inv_temps, uniforms)
        probs = filtered_probs(logits, [r.params for r in rows])
        return inverse_cdf_draw(probs, uniforms)

    def _uniforms(self, rows: Sequence[SampleRow]) -> torch.Tensor:
        """One float64 draw in [0, 1) per row: from ``(seed, position)`` for a seeded
        row, from the executor's generator for the others (one call for all of them)."""
        num_unseeded = sum(r.params.seed is None for r in rows)
        fresh = iter(torch.rand(num_unseeded, dtype=torch.float64, generator=self.rng).tolist())
        values = [
            next(fresh) if r.params.seed is None else seeded_uniform(r.params.seed, r.position)
            for r in rows
        ]
        return torch.tensor(values, dtype=torch.float64)

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, rows: Sequence[SampleRow], tokens: list[int]
    ) -> list[TokenLogprobs | None]:
        wanted = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        result: list[TokenLogprobs | None] = [None] * len(rows)
        if not wanted:
            return result
        logp = torch.log_softmax(logits[torch.tensor(wanted)], dim=-1)  # [wanted, vocab]
        for j, i in enumerate(wanted):
            # Never more alternatives than the vocabulary has.
            n_top = min(rows[i].params.logprobs or 0, logits.shape[-1])
            top: list[tuple[int, float]] = []
            if n_top:
                values, ids = logp[j].topk(n_top)
                top = list(zip(ids.tolist(), values.tolist(), strict=True))
            result[i] = TokenLogprobs(logprob=float(logp[j, tokens[i]]), top=top)
        return result


def filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, then top-p, row by row: float32 ``[rows, vocab]`` logits
    to probabilities with filtered-out tokens at exactly 0. Every row keeps at least its
    likeliest token and is finite for finite logits, whatever the parameters
    (temperatures are floored at ``MIN_TEMPERATURE``)."""
    vocab = logits.shape[-1]
    k_rows = [i for i, p in enumerate(params) if 0 < p.top_k < vocab]
    p_rows = [i for i, p in enumerate(params) if p.top_p < 1]
    if not k_rows and not p_rows and all(p.temperature == 1.0 for p in params):
        return torch.softmax(logits, dim=-1)  # the API's default: no copy of the logits
    temps = torch.tensor([max(p.temperature, MIN_TEMPERATURE) for p in params], dtype=torch.float32)
    scaled = logits / temps[:, None]
    if k_rows:
        idx = torch.tensor(k_rows)
        k = torch.tensor([params[i].top_k for i in k_rows])
        # The k-th largest logit of each row, from the largest k only (no full sort).
        largest = scaled[idx].topk(int(k.max()), dim=-1).values
        kth = largest.gather(1, (k - 1)[:, None])
        scaled[idx] = scaled[idx].masked_fill(scaled[idx] < kth, -torch.inf)
    # Rows with top_p == 1 drop nothing (a cumulative sum can round past 1.0 and would
    # otherwise cut their tail), so only the others are filtered.
    if p_rows:
        idx = torch.tensor(p_rows)
        top_p = torch.tensor([params[i].top_p for i in p_rows], dtype=torch.float32)
        kept = nucleus(torch.softmax(scaled[idx], dim=-1), top_p)
        scaled[idx] = scaled[idx].masked_fill(~kept, -torch.inf)
    return torch.softmax(scaled, dim=-1)


# Top-p looks for its nucleus among this many likeliest tokens first, then 8 times as
# many, and so on: a full sort of 64 rows of 49,152 took 97 ms on 2 threads, the 1,024
# likeliest of each 3 ms.
NUCLEUS_CANDIDATES = 1024


def nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Which tokens top-p keeps: ``probs`` ``[rows, vocab]``, ``top_p`` ``[rows]`` in (0, 1).

    Tokens in descending order of probability are dropped once the mass strictly before
    them reaches ``top_p``; the first always stays (a ``top_p`` that rounds to 0 in
    float32 would drop it too). When the ``n`` likeliest tokens already hold ``top_p``,
    every later token has that much before it, so only those ``n`` are sorted.
    """
    vocab = probs.shape[-1]
    n = min(NUCLEUS_CANDIDATES, vocab)
    while True:
        values, order = probs.topk(n, dim=-1)  # [rows, n], descending
        mass = values.cumsum(dim=-1)
        if n == vocab or bool((mass[:, -1] >= top_p).all()):
            break
        n = min(8 * n, vocab)
    drop_sorted = (mass - values) >= top_p[:, None]
    drop_sorted[:, 0] = False
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(1, order, ~drop_sorted)
