"""The client resends a request once, on a fresh connection, when the server closed its
kept-alive connection before any response byte (as llama.cpp's ``llama-server`` does
with idle connections), and never resends one the server had begun to answer. The
server is a real one on 127.0.0.1 that speaks just enough HTTP/1.1."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.bench.client import Api, StreamClient
from orchestrator.bench.results import BenchReport, read_report, write_report
from orchestrator.bench.runner import run_load, summarize_run
from orchestrator.common.metrics import SLO
from orchestrator.common.workloads import ClosedLoop
from tests.bench.helpers import UnusableTokenizer, make_requests

TIMEOUT_S = 10.0  # bounds every exchange: a hang fails the test instead of stalling it


def _sse_response(text: str) -> bytes:
    events = [
        {"choices": [{"index": 0, "text": text, "finish_reason": None}]},
        {
            "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        },
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    raw = body.encode()
    head = (
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        f"content-length: {len(raw)}\r\nconnection: keep-alive\r\n\r\n"
    )
    return head.encode() + raw


@dataclass
class KeepAliveServer:
    """Answers the first ``answer_per_connection`` requests of each connection in full
    (keep-alive), then reads the next request and closes without a byte in reply.
    With ``cut_after_status``, it instead sends a 200 and part of a stream, then closes.
    Counts connections and requests read."""

    answer_per_connection: int
    cut_after_status: bool = False
    connections: int = 0
    requests: int = 0
    _server: asyncio.Server | None = field(default=None, repr=False)

    async def __aenter__(self) -> KeepAliveServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _read_request(self, reader: asyncio.StreamReader) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)
        self.requests += 1

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for _ in range(self.answer_per_connection):
                await self._read_request(reader)
                writer.write(_sse_response("hi"))
                await writer.drain()
            await self._read_request(reader)
            if self.cut_after_status:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b'content-length: 1000\r\n\r\ndata: {"choices": []}\n\n'
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _two_in_a_row(server: KeepAliveServer):
    """Two requests one after the other, so the second takes the first's pooled
    connection."""
    async with StreamClient(server.url, Api.COMPLETIONS, "m", max_connections=1) as client:
        first, second = make_requests(2)
        a = await asyncio.wait_for(client.stream(first), TIMEOUT_S)
        b = await asyncio.wait_for(client.stream(second), TIMEOUT_S)
    return a, b


def test_a_request_on_a_connection_closed_before_answering_is_resent_once_on_a_fresh_one():
    async def go():
        async with KeepAliveServer(answer_per_connection=1) as server:
            a, b = await _two_in_a_row(server)
            return server, a, b

    server, a, b = asyncio.run(go())
    assert a.error is None and a.retries == 0
    assert b.error is None, b.error
    assert b.retries == 1 and b.text == "hi" and b.completion_tokens == 1
    # The resend went on a second connection, and the server read all three sends.
    assert server.connections == 2 and server.requests == 3


def test_the_resend_happens_once_and_a_second_close_is_the_result():
    async def go():
        async with KeepAliveServer(answer_per_connection=0) as server:
            async with StreamClient(server.url, Api.COMPLETIONS, "m") as client:
                result = await asyncio.wait_for(client.stream(make_requests(1)[0]), TIMEOUT_S)
            return server, result

    server, result = asyncio.run(go())
    assert result.retries == 1 and result.status_code is None
    assert result.error is not None and "without sending a response" in result.error
    assert server.connections == 2 and server.requests == 2


def test_a_stream_cut_after_the_status_is_never_resent():
    async def go():
        async with KeepAliveServer(answer_per_connection=1, cut_after_status=True) as server:
            a, b = await _two_in_a_row(server)
            return server, a, b

    server, a, b = asyncio.run(go())
    assert a.error is None
    assert b.retries == 0 and b.error is not None
    assert server.connections == 1 and server.requests == 2


def test_resends_are_counted_in_the_run_summary_and_its_file(tmp_path: Path):
    requests = make_requests(3)

    async def go():
        async with (
            KeepAliveServer(answer_per_connection=1) as server,
            StreamClient(server.url, Api.COMPLETIONS, "m", max_connections=1) as client,
        ):
            shape = ClosedLoop(concurrency=1)
            return await asyncio.wait_for(run_load(client, requests, shape, 0), TIMEOUT_S)

    run = asyncio.run(go())
    # Request 2 met request 1's closed connection and was resent; request 3 then opened
    # a new pooled connection (the closed one was dropped), which answered it first.
    assert [r.retries for r in run.results] == [0, 1, 0]
    summary, records = summarize_run(run, requests, UnusableTokenizer(), SLO(), "r.jsonl")
    assert summary.retries == 1 and all(r.ok for r in records)
    path = tmp_path / "summary.json"
    write_report(path, BenchReport("x", {}, [summary]))
    assert read_report(path).runs[0].retries == 1
