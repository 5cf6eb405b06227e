"""A small OpenAI-compatible test server that streams SSE with known, injected delays.

Raw asyncio HTTP/1.1 (keep-alive, chunked bodies) on 127.0.0.1 in a child process, so
its timing does not share an event loop or the GIL with the client under test. It serves
``GET /v1/models``, ``GET /ready``, ``POST /v1/completions`` and
``POST /v1/chat/completions``; the ``Behaviour`` decides delays, usage, and which
failure to inject. Output text is one word per token (``" t0 t1 ..."``), so a
whitespace tokenizer counts it exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal

import httpx

Mode = Literal["sse", "json", "garbage", "drop", "error_event"]


@dataclass
class Behaviour:
    """What the server does. Delays are seconds, per streamed chunk.

    ``mode``: ``sse`` streams properly; ``json`` answers 200 with a non-OpenAI JSON
    body; ``garbage`` streams events without ``choices``; ``drop`` closes the connection
    after half the chunks; ``error_event`` sends an ``{"error"}`` event mid-stream.
    ``error_status`` with ``fail_every`` k answers every k-th generation request
    (counting from 1) after the first ``spare_first`` with that status and an OpenAI
    error body.
    ``hold_until`` n delays the first token until n generation streams are open at once.
    """

    ttft_s: float = 0.0
    itl_s: float = 0.0
    tokens_per_chunk: int = 1
    send_usage: bool = True
    model: str = "test-model"
    mode: Mode = "sse"
    error_status: int | None = None
    fail_every: int = 1
    spare_first: int = 0
    reject_ignore_eos: bool = False
    eos_after: int | None = None
    models_status: int = 200
    models_body: bytes | None = None
    hold_until: int = 0


@dataclass
class ServerState:
    """What the server saw: request bodies in arrival order, TCP connections that
    carried API requests, and the most generation streams open at once."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    connections: int = 0
    open_streams: int = 0
    peak_streams: int = 0


class SSEServer:
    """Handle on a test server running in a child process (its own interpreter, so its
    timing shares neither an event loop nor a GIL with the client under test)."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.port = 0
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve_forever, args=(behaviour, child_conn), daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state(self) -> ServerState:
        """What the server has seen so far (fetched from it)."""
        return ServerState(**httpx.get(self.url + STATE_PATH, timeout=5).json())

    def start(self) -> SSEServer:
        self._process.start()
        if not self._conn.poll(30):
            raise RuntimeError("the test server did not start within 30 s")
        self.port = self._conn.recv()
        return self

    def stop(self) -> None:
        self._process.terminate()
        self._process.join(5)
        self._conn.close()


STATE_PATH = "/_state"


def _serve_forever(behaviour: Behaviour, conn: Connection | None, port: int = 0) -> None:
    """Listen on loopback ``port`` (0: a free one), send the port to ``conn`` when
    given, and serve until killed."""

    async def main() -> None:
        handler = _Handler(behaviour)
        server = await asyncio.start_server(handler.handle, "127.0.0.1", port)
        if conn is not None:
            conn.send(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


def serve_forever(behaviour: Behaviour, port: int) -> None:
    """Serve in this process on ``port`` until killed (for a stand-in server command)."""
    _serve_forever(behaviour, None, port)


class _Handler:
    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.state = ServerState()
        self._released = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counted = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode().split("\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (h.partition(":") for h in header_lines if h)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                method, path, _ = request_line.split(" ", 2)
                if path == STATE_PATH:
                    await _respond(writer, 200, json.dumps(asdict(self.state)).encode())
                    continue
                if not counted:  # connections that carried API requests
                    counted = True
                    self.state.connections += 1
                if not await self._route(method, path, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            writer.close()

    async def _route(
        self, method: str, path: str, raw: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; ``False`` when the connection must close."""
        b = self.behaviour
        if method == "GET" and path == "/ready":
            await _respond(writer, 200, b'{"status": "ready"}')
            return True
        if method == "GET" and path == "/v1/models":
            body = (
                b.models_body
                or json.dumps(
                    {"object": "list", "data": [{"id": b.model, "object": "model"}]}
                ).encode()
            )
            await _respond(writer, b.models_status, body)
            return True
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            await _respond(writer, 404, _error_body("not found"))
            return True
        request = json.loads(raw)
        self.state.bodies.append(request)
        index = len(self.state.bodies) - b.spare_first
        if b.error_status is not None and index > 0 and index % b.fail_every == 0:
            await _respond(writer, b.error_status, _error_body("injected failure"))
            return True
        if b.reject_ignore_eos and "ignore_eos" in request:
            await _respond(writer, 400, _error_body("unknown parameter ignore_eos"))
            return True
        if b.mode == "json":
            await _respond(writer, 200, b'{"result": "not openai"}')
            return True
        return await self._stream(request, chat=path.endswith("chat/completions"), writer=writer)

    async def _stream(
        self, request: dict[str, Any], chat: bool, writer: asyncio.StreamWriter
    ) -> bool:
        b = self.behaviour
        num_tokens = request["max_tokens"]
        if b.eos_after is not None and not request.get("ignore_eos"):
            num_tokens = min(num_tokens, b.eos_after)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        self.state.open_streams += 1
        self.state.peak_streams = max(self.state.peak_streams, self.state.open_streams)
        try:
            await self._hold()
            await asyncio.sleep(b.ttft_s)
            if chat:
                await _event(writer, _chunk(chat, {"role": "assistant", "content": ""}, None))
            starts = list(range(0, num_tokens, b.tokens_per_chunk))
            for n, start in enumerate(starts):
                if n > 0:
                    await asyncio.sleep(b.itl_s)
                if b.mode == "drop" and n == len(starts) // 2:
                    return False
                if b.mode == "error_event" and n == len(starts) // 2:
                    await _event(writer, {"error": {"message": "engine stopped", "code": None}})
                    break
                text = "".join(
                    f" t{i}" for i in range(start, min(num_tokens, start + b.tokens_per_chunk))
                )
                payload = {"foo": text} if b.mode == "garbage" else _chunk(chat, text, None)
                await _event(writer, payload)
            else:
                await _event(writer, _chunk(chat, "", "length"))
                usage = request.get("stream_options", {}).get("include_usage")
                if usage and b.send_usage:
                    await _event(
                        writer,
                        {
                            "choices": [],
                            "usage": {
                                "prompt_tokens": len(_prompt_text(request).split()),
                                "completion_tokens": num_tokens,
                                "total_tokens": num_tokens,
                            },
                        },
                    )
            await _write_chunk(writer, b"data: [DONE]\n\n")
            await _write_chunk(writer, b"")
            return True
        finally:
            self.state.open_streams -= 1

    async def _hold(self) -> None:
        """Wait (at most 10 s) until ``hold_until`` streams have been open at once."""
        released = self._released
        if self.state.open_streams >= self.behaviour.hold_until:
            released.set()  # a latch: streams that finish later do not re-block anyone
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(released.wait(), timeout=10.0)


def _prompt_text(request: dict[str, Any]) -> str:
    if "messages" in request:
        return " ".join(m["content"] for m in request["messages"])
    return str(request["prompt"])


def _chunk(chat: bool, content: Any, finish_reason: str | None) -> dict[str, Any]:
    if chat:
        delta = content if isinstance(content, dict) else ({"content": content} if content else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return {"object": "chat.completion.chunk", "choices": [choice]}
    choice = {"index": 0, "text": content, "finish_reason": finish_reason}
    return {"object": "text_completion", "choices": [choice]}


def _error_body(message: str) -> bytes:
    return json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    ).encode()


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()


async def _event(writer: asyncio.StreamWriter, payload: dict[str, Any]) -> None:
    await _write_chunk(writer, f"data: {json.dumps(payload)}\n\n".encode())


async def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()
