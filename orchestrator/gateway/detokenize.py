"""Token ids to text, one step at a time, and stop strings matched across token boundaries.

``IncrementalDetokenizer`` never emits a broken UTF-8 character: a byte-level tokenizer
may split one character (an emoji, an accented letter) over several tokens, and decoding
the first of them alone yields U+FFFD. Text is held back until the character completes.

``StopStringMatcher`` finds stop strings in the concatenated text however the tokens cut
it, and withholds any tail that might be the start of a stop string, so the stop text is
never returned to the client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"

# Tokens of prompt context decoded together with the output: tokenizers that drop a
# word's leading space when it starts the decoded text (SentencePiece) need a little
# left context to decode the first output token right.
PROMPT_CONTEXT_TOKENS = 5


class TokenDecoder(Protocol):
    """What the detokenizer needs from a tokenizer."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``; incomplete UTF-8 sequences become U+FFFD."""
        ...


class IncrementalDetokenizer:
    """Turns a request's output tokens into text deltas.

    ``push(ids)`` returns the text that ``ids`` completed (possibly empty while a
    multi-token character is pending); ``flush()`` returns whatever is still held back at
    the end of the request (with U+FFFD for bytes that never completed a character).
    The concatenation of every delta equals the decoding of all output tokens.

    Each push decodes only the tokens since the last emitted text, so the cost per token
    does not grow with the length of the output.
    """

    def __init__(
        self,
        tokenizer: TokenDecoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        # _ids[prefix:read] is context already emitted; _ids[read:] is pending.
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_ids: Sequence[int]) -> str:
        """Append tokens; return the newly completed text."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """Text of tokens still held back (the request has ended; nothing more comes)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :]

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)


class StopStringMatcher:
    """Cuts a text stream at the first occurrence of any stop string.

    ``push(text)`` returns ``(safe_text, stopped)``: ``safe_text`` can be sent to the
    client now; once ``stopped`` is true the stream has ended before the stop string and
    further pushes return nothing. ``flush()`` releases the held-back tail when the
    stream ends without a match.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self._stop = tuple(stop)
        self._pending = ""
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self._stop:
            return text, False
        # Every occurrence starts inside the pending text: anything that could begin a
        # stop string was held back, so searching the pending text alone suffices.
        pending = self._pending + text
        cut = min((i for s in self._stop if (i := pending.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._pending = ""
            return pending[:cut], True
        hold = self._longest_partial_match(pending)
        self._pending = pending[len(pending) - hold :]
        return pending[: len(pending) - hold], False

    def flush(self) -> str:
        tail, self._pending = self._pending, ""
        return "" if self.stopped else tail

    def _longest_partial_match(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
