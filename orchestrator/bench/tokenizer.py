"""The tokenizer the benchmark uses to cut synthetic prompts and, when a server reports
no ``usage``, to count output tokens. It loads on first use: a replayed workload against
a server that reports usage never needs it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from orchestrator.bench.errors import BenchError


class TextTokenizer(Protocol):
    """Text to token ids and back, without special tokens (no BOS/EOS added)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ModelTokenizer:
    """A model's tokenizer, loaded by ``orchestrator.common.model_source`` on the first call.

    ``source`` is anything ``ModelConfig.source`` accepts: ``embedded:<name>``, a local
    Hugging Face folder, a folder holding a GGUF file, or a Hub repo id.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self._tokenizer: Any = None

    @property
    def loaded(self) -> bool:
        return self._tokenizer is not None

    def _get(self) -> Any:
        if self._tokenizer is None:
            from orchestrator.common.model_source import load_tokenizer
            from orchestrator.core import ModelConfig

            try:
                self._tokenizer = load_tokenizer(ModelConfig(source=self.source))
            except (ImportError, OSError, ValueError) as err:
                raise BenchError(
                    f"cannot load tokenizer {self.source!r}: {err}; pass --tokenizer with a "
                    "local model folder or an embedded model name"
                ) from None
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._get().encode(text, add_special_tokens=False)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self._get().decode(list(ids))
        return text
