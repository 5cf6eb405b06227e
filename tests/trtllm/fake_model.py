"""The language model and sampler behind both TensorRT-LLM fakes.

Logits are a pure function of the context (its last tokens and its length), so greedy
decoding gives the same tokens however a request is batched, chunked or re-submitted.
Sampling follows TensorRT-LLM's rules: ``top_k == 1``, or neither ``top_k`` nor
``top_p`` set, is greedy; otherwise temperature, then top-k, then top-p, then one draw
from a generator seeded once per request when it is submitted (seed 0 when unset), so a
re-submitted request starts its random sequence again.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

_WINDOW = 8  # context tokens the logits depend on (with the context length)


def next_token_logits(context: Sequence[int], vocab_size: int) -> list[float]:
    key = f"{len(context)}|{list(context[-_WINDOW:])}".encode()
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    rng = random.Random(seed)
    return [rng.gauss(0.0, 3.0) for _ in range(vocab_size)]


class Sampler:
    """Picks each token of one request; returns it with its log-probability under the
    temperature-scaled distribution. Unset values take TensorRT-LLM's defaults (top-k 0,
    top-p 0, temperature 1, seed 0)."""

    def __init__(
        self,
        *,
        top_k: int | None = None,
        top_p: float | None = None,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> None:
        self.top_k = top_k or 0
        self.top_p = float(top_p or 0.0)
        self.temperature = float(temperature if temperature is not None else 1.0)
        self.greedy = self.top_k == 1 or (self.top_k == 0 and self.top_p == 0.0)
        self._rng = random.Random(seed or 0)

    def sample(self, logits: list[float]) -> tuple[int, float]:
        temperature = self.temperature if self.temperature > 0 else 1.0
        scaled = [x / temperature for x in logits]
        top = max(scaled)
        log_norm = top + math.log(sum(math.exp(x - top) for x in scaled))
        if self.greedy:
            token = max(range(len(scaled)), key=scaled.__getitem__)
            return token, scaled[token] - log_norm
        ranked = sorted(range(len(scaled)), key=scaled.__getitem__, reverse=True)
        if self.top_k > 0:
            ranked = ranked[: self.top_k]
        probs = [math.exp(scaled[t] - log_norm) for t in ranked]
        if self.top_p > 0:
            kept, total = 0, 0.0
            while kept < len(probs) and total < self.top_p:
                total += probs[kept]
                kept += 1
            ranked, probs = ranked[:kept], probs[:kept]
        u = self._rng.random() * sum(probs)
        for token, p in zip(ranked, probs, strict=True):
            u -= p
            if u <= 0:
                return token, scaled[token] - log_norm
        return ranked[-1], scaled[ranked[-1]] - log_norm
