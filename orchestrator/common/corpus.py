"""Real English text for synthetic prompts, available offline: the topic pages of
Python's own documentation that ship with CPython (``pydoc_data.topics``)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence


@functools.cache
def corpus_text() -> str:
    """About 0.8 MB of English prose and code from the Python reference manual."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def token_prompts(
    encode: Callable[[str], list[int]], lengths: Sequence[int], seed: int
) -> list[list[int]]:
    """One prompt of exactly ``lengths[i]`` token ids per entry, each a window of the
    tokenised corpus at a position drawn from ``random.Random(seed)``."""
    tokens = encode(corpus_text())  # a second or two for a fast tokenizer
    rng = random.Random(seed)
    prompts = []
    for n in lengths:
        if not 0 < n <= len(tokens):
            raise ValueError(f"prompt length {n} outside 1..{len(tokens)} tokens")
        start = rng.randrange(0, len(tokens) - n + 1)
        prompts.append(tokens[start : start + n])
    return prompts
