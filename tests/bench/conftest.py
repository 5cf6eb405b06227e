"""Fixtures of the benchmark-client tests: the local SSE test server and a whitespace
tokenizer that needs no model files."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from orchestrator.bench.load import BurstArrivals
from tests.bench.helpers import make_requests, run
from tests.bench.sse_server import Behaviour, SSEServer


class WordTokenizer:
    """One token per whitespace-separated word; ids index a growing vocabulary."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.words: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for word in text.split():
            if word not in self.ids:
                self.ids[word] = len(self.words)
                self.words.append(word)
            out.append(self.ids[word])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.words[i] for i in ids)


@pytest.fixture
def word_tokenizer() -> WordTokenizer:
    return WordTokenizer()


@pytest.fixture(scope="session", autouse=True)
def warm_client() -> None:
    """Stream once before any test: the first request of a process pays for lazy
    imports and set-up inside httpx, which no measured test should see."""
    server = SSEServer(Behaviour()).start()
    try:
        run(server.url, make_requests(1), BurstArrivals())
    finally:
        server.stop()


@pytest.fixture
def sse_server() -> Iterator[Callable[..., SSEServer]]:
    """``sse_server(**behaviour)`` starts a test server; all stop after the test."""
    servers: list[SSEServer] = []

    def start(**behaviour: Any) -> SSEServer:
        server = SSEServer(Behaviour(**behaviour)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
