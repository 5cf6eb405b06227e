"""The tokenizer as the gateway uses it: prompts to ids, ids to text, end-of-sequence ids.

``HFTokenizer`` adapts a Hugging Face tokenizer (``orchestrator.common.model_source.
load_tokenizer``); tests supply a small fake with the same methods.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol

# Special tokens that end a turn or a document in common chat models. A GGUF file
# carries one ``eos_token``; the chat end and the document end are often different
# tokens (SmolLM2: <|im_end|> and <|endoftext|>), and a model may emit either.
END_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "</s>",
)


_PROBE_TOOL = "probe_tool_3f1c9a"  # a name no template writes unless given it


class ChatTemplateError(ValueError):
    """The messages cannot be rendered: no chat template, or the template refused them."""


class Tokenizer(Protocol):
    """Text in, token ids out, and back."""

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation unless the client sets ``ignore_eos``."""
        ...

    @property
    def vocab_size(self) -> int:
        """Token ids are in ``[0, vocab_size)``."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of a raw prompt (with the model's usual leading special tokens)."""
        ...

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template writes the ``tools`` it is given (and so the tool
        calls and results in messages); if not, the gateway renders them as text."""
        ...

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of ``[{"role", "content", ...}, ...]`` through the model's chat
        template (with ``tools``, OpenAI's tool definitions, where given), ending with
        the prompt for the assistant's turn; ``ChatTemplateError`` if the messages
        cannot be rendered."""
        ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``; incomplete UTF-8 sequences become U+FFFD."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (for logprobs)."""
        ...


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class HFTokenizer:
    """A Hugging Face tokenizer behind the ``Tokenizer`` protocol."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self._special_ids = frozenset(tokenizer.all_special_ids)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # Byte-level BPE (GPT-2 style) tokens spell raw bytes in a printable alphabet.
        self._byte_level = type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"

    @functools.cached_property
    def eos_token_ids(self) -> tuple[int, ...]:
        ids: list[int] = []
        if self._tok.eos_token_id is not None:
            ids.append(self._tok.eos_token_id)
        for token in END_TOKENS:
            token_id = self._tok.convert_tokens_to_ids(token)
            if token_id in self._special_ids and token_id not in ids:
                ids.append(token_id)
        return tuple(ids)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=True)
        return ids

    @functools.cached_property
    def renders_tools(self) -> bool:
        # A template may ignore ``tools`` silently (SmolLM2's does): render a probe tool
        # and look for its name.
        if self._tok.chat_template is None:
            return False
        probe = {"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {}}}
        try:
            text = self._tok.apply_chat_template(
                [{"role": "user", "content": "x"}],
                tools=[probe],
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception:  # a template that refuses tools does not render them
            return False
        return _PROBE_TOOL in text

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        if self._tok.chat_template is None:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        extra: dict[str, Any] = {"tools": list(tools)} if tools else {}
        try:
            text = self._tok.apply_chat_template(
                list(messages), add_generation_prompt=True, tokenize=False, **extra
            )
        except Exception as err:  # jinja2 raises its own errors (e.g. role order)
            raise ChatTemplateError(f"the chat template refused these messages: {err}") from err
        # The template already wrote the special tokens the model expects.
        ids: list[int] = self._tok.encode(text, add_special_tokens=False)
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        text: str = self._tok.decode(
            list(token_ids),
            skip_special_tokens=skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        return text

    def token_bytes(self, token_id: int) -> bytes:
        if self._byte_level and token_id not in self._special_ids:
            piece: str = self._tok.convert_ids_to_tokens(token_id)
            alphabet = _byte_level_alphabet()
            if all(c in alphabet for c in piece):
                return bytes(alphabet[c] for c in piece)
        return self.decode([token_id], skip_special_tokens=False).encode()
