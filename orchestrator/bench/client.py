"""Streaming client for OpenAI-compatible servers (``/v1/completions`` and
``/v1/chat/completions``).

One ``httpx.AsyncClient`` (HTTP/1.1 keep-alive, a connection pool sized to the most
requests a load shape keeps open) carries every stream. Each request is timed with
``time.perf_counter()``: the send time just before the request goes out, and the
arrival time of every SSE event that carries text. A request that fails for any reason
(HTTP status, transport error, malformed stream) returns a ``StreamResult`` with
``error`` set; it is never dropped.

One failure is retried: a pooled keep-alive connection that the server had closed (it
drops idle ones on its own schedule, e.g. llama.cpp's ``llama-server``) fails the
request before any response byte arrives. Such a request never reached the server, so
it is sent once more, on a fresh connection, and counted in ``StreamResult.retries``;
anything that failed after a byte arrived is the server's answer and is never resent.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

from orchestrator.bench.bench_requests import BenchRequest
from orchestrator.bench.errors import BenchError

# A stream that finished cleanly but carried no text. Measured requests count it as a
# failure; the probe accepts it (one token may decode to no text yet).
NO_TOKENS_ERROR = "stream finished without output text"

_PROBE = BenchRequest(request_id="probe", prompt="Hello", num_prompt_tokens=1, max_tokens=1)
_SNIPPET_CHARS = 200


class Api(enum.StrEnum):
    """Which OpenAI endpoint to call."""

    COMPLETIONS = "completions"
    CHAT = "chat"

    @property
    def path(self) -> str:
        return "/v1/completions" if self is Api.COMPLETIONS else "/v1/chat/completions"


@dataclass(slots=True)
class StreamResult:
    """What one streamed request gave.

    Times are ``time.perf_counter()`` seconds: ``send_time`` just before the request was
    sent, ``chunk_times`` when each event carrying text arrived, ``end_time`` when the
    response ended (or failed). ``prompt_tokens`` and ``completion_tokens`` come from
    the server's ``usage`` (``None`` when it sent none). ``status_code`` is the HTTP
    status, or ``None`` when the failure came after a 200 (transport error, malformed
    or interrupted stream) or before any response; ``error`` is ``None`` for success.
    """

    request_id: str
    send_time: float
    end_time: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    status_code: int | None = None
    error: str | None = None
    retries: int = 0  # sends repeated after the connection closed before any response


class NotOpenAIError(Exception):
    """A response or stream event is not in OpenAI's format."""


class ServerStreamError(Exception):
    """The server sent an ``{"error": ...}`` event inside the stream."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One parsed SSE event: its text (all choices), whether a choice finished, and the
    usage it reported."""

    text: str
    finished: bool
    prompt_tokens: int | None
    completion_tokens: int | None


def parse_chunk(obj: Any, api: Api) -> Chunk:
    """Read one ``data:`` event of a completion or chat stream.

    Raises ``ServerStreamError`` for an error event and ``NotOpenAIError`` when the
    event lacks ``choices`` or a choice has the wrong shape for ``api``.
    """
    if not isinstance(obj, dict):
        raise NotOpenAIError(f"event is not a JSON object: {_snippet(obj)}")
    if "error" in obj:
        raise ServerStreamError(_error_text(obj["error"]))
    choices = obj.get("choices")
    if not isinstance(choices, list):
        raise NotOpenAIError(f"event has no 'choices' list: {_snippet(obj)}")
    texts, finished = [], False
    for choice in choices:
        if not isinstance(choice, dict):
            raise NotOpenAIError(f"a choice is not an object: {_snippet(choice)}")
        if api is Api.CHAT:
            delta = choice.get("delta") or {}
            text = delta.get("content") if isinstance(delta, dict) else None
        else:
            text = choice.get("text")
        if text is not None and not isinstance(text, str):
            raise NotOpenAIError(f"choice text is not a string: {_snippet(choice)}")
        texts.append(text or "")
        finished = finished or choice.get("finish_reason") is not None
    prompt_tokens = completion_tokens = None
    usage = obj.get("usage")
    if isinstance(usage, dict):
        prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
        completion_tokens = _int_or_none(usage.get("completion_tokens"))
    return Chunk("".join(texts), finished, prompt_tokens, completion_tokens)


def normalize_base_url(url: str) -> str:
    """``http(s)://host:port`` with no trailing slash or ``/v1`` (both are accepted)."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise BenchError(f"--url {url!r}: expected http://HOST:PORT (or https://...)")
    base = url.rstrip("/")
    return base.removesuffix("/v1")


class StreamClient:
    """Sends ``BenchRequest``s as streaming requests and times them.

    ``model`` ``None`` means: the first model the server lists (filled in by
    ``prepare``). ``ignore_eos`` adds the ``ignore_eos`` extension so outputs run to
    ``max_tokens``; ``prepare`` turns it off when the server rejects it.
    ``max_connections`` should be the most requests open at once: a smaller pool would
    queue requests inside the client and add that wait to their TTFT. ``timeout_s`` is
    the longest silence allowed while reading a response (seconds).
    """

    def __init__(
        self,
        base_url: str,
        api: Api,
        model: str | None,
        *,
        api_key: str | None = None,
        ignore_eos: bool = True,
        max_connections: int = 64,
        timeout_s: float = 300.0,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.api = api
        self.model = model
        self.ignore_eos = ignore_eos
        self.endpoint = self.base_url + api.path
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # pool=None: with the pool sized to the load, waiting for a connection is
        # bounded by the requests ahead, not a failure.
        self._timeout = httpx.Timeout(timeout_s, connect=10.0, pool=None)
        self._http = httpx.AsyncClient(
            headers=self._headers,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            timeout=self._timeout,
        )

    async def __aenter__(self) -> StreamClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._http.aclose()

    def body(self, request: BenchRequest) -> dict[str, Any]:
        """The JSON body sent for ``request``."""
        body: dict[str, Any] = {"model": self.model}
        if self.api is Api.CHAT:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        body |= {
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    async def prepare(self) -> list[str]:
        """Check the server before measuring and settle the request options.

        Lists the served models (picking one when ``model`` is ``None``), then sends a
        one-token probe. Returns notes for the user; raises ``BenchError`` when the
        server is unreachable, answers non-OpenAI JSON, or the probe fails.
        """
        notes: list[str] = []
        served = await self._served_models()
        if self.model is None:
            self.model = served[0]
            if len(served) > 1:
                notes.append(f"the server lists {len(served)} models; using {self.model!r}")
        elif served and self.model not in served:
            raise BenchError(
                f"model {self.model!r} is not served at {self.base_url}; it serves: "
                + ", ".join(served)
            )
        probe = await self.stream(_PROBE)
        if probe.error is not None and self.ignore_eos and probe.status_code in (400, 422):
            self.ignore_eos = False
            retry = await self.stream(_PROBE)
            if retry.error in (None, NO_TOKENS_ERROR):
                notes.append(
                    f"the server rejected 'ignore_eos' ({probe.error}); sending max_tokens "
                    "only, so outputs may stop early at end-of-sequence"
                )
                return notes
            self.ignore_eos = True
        if probe.error not in (None, NO_TOKENS_ERROR):
            status = f"HTTP {probe.status_code}: " if probe.status_code is not None else ""
            raise BenchError(f"probe request to {self.endpoint} failed: {status}{probe.error}")
        return notes

    async def _served_models(self) -> list[str]:
        """Model ids from ``GET /v1/models``; empty when the server lacks that route and
        ``model`` is already known."""
        url = self.base_url + "/v1/models"
        try:
            resp = await self._http.get(url)
        except httpx.HTTPError as err:
            raise BenchError(
                f"cannot reach {self.base_url}: {_describe(err)}; is the server running "
                "and is --url right?"
            ) from None
        if resp.status_code in (401, 403):
            raise BenchError(
                f"{url} answered HTTP {resp.status_code}: {_error_body(resp.content)}; "
                "pass --api-key (or set OPENAI_API_KEY)"
            )
        if resp.status_code != 200:
            if self.model is not None:
                return []
            raise BenchError(
                f"{url} answered HTTP {resp.status_code}; pass --model NAME to skip discovery"
            )
        try:
            data = resp.json()["data"]
            ids = [m["id"] for m in data]
            if not ids or not all(isinstance(i, str) for i in ids):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise BenchError(
                f"{url} answered non-OpenAI JSON (expected {{'data': [{{'id': ...}}]}}): "
                f"{resp.text[:_SNIPPET_CHARS]!r}"
            ) from None
        return ids

    async def stream(self, request: BenchRequest) -> StreamResult:
        """Send ``request`` and read its stream to the end; never raises for a failed
        request (the failure is in the result). A send whose connection closed before
        any response byte is repeated once on a fresh connection (module doc);
        ``send_time`` stays the first send's, so the lost attempt counts in the TTFT."""
        body = self.body(request)
        result = StreamResult(request.request_id, send_time=time.perf_counter())
        unanswered = await self._attempt(self._http, body, result)
        if unanswered:
            result.retries += 1
            result.error = None
            async with httpx.AsyncClient(headers=self._headers, timeout=self._timeout) as fresh:
                await self._attempt(fresh, body, result)
        result.end_time = time.perf_counter()
        if result.error is not None and result.status_code == 200:
            # A 200 followed by a failure is not an HTTP status error; errors are then
            # grouped by their message instead.
            result.status_code = None
        return result

    async def _attempt(
        self, http: httpx.AsyncClient, body: dict[str, Any], result: StreamResult
    ) -> bool:
        """One send of ``body`` over ``http``, recorded into ``result``; true when it
        failed because the connection closed before any response byte arrived."""
        try:
            async with http.stream("POST", self.endpoint, json=body) as resp:
                result.status_code = resp.status_code
                if resp.status_code != 200:
                    result.error = _error_body(await resp.aread())
                elif not resp.headers.get("content-type", "").startswith("text/event-stream"):
                    kind = resp.headers.get("content-type") or "no content type"
                    raw = await resp.aread()
                    raise NotOpenAIError(f"expected an SSE stream, got {kind}: {_snippet(raw)}")
                else:
                    await self._read_events(resp, result)
        except httpx.HTTPError as err:
            result.error = _describe(err)
            return result.status_code is None and _closed_before_response(err)
        except NotOpenAIError as err:
            result.error = f"non-OpenAI response: {err}"
        except ServerStreamError as err:
            result.error = f"error event in stream: {err}"
        return False

    async def _read_events(self, resp: httpx.Response, result: StreamResult) -> None:
        parts: list[str] = []
        finished = done = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, `event:` lines
            now = time.perf_counter()
            data = line[5:].strip()
            if data == "[DONE]":
                # Keep reading: the body's end follows, and reading it lets the
                # connection go back to the pool.
                done = True
                continue
            try:
                chunk = parse_chunk(json.loads(data), self.api)
            except json.JSONDecodeError:
                raise NotOpenAIError(f"event is not JSON: {_snippet(data)}") from None
            if chunk.text:
                result.chunk_times.append(now)
                parts.append(chunk.text)
            finished = finished or chunk.finished
            if chunk.completion_tokens is not None:
                result.completion_tokens = chunk.completion_tokens
            if chunk.prompt_tokens is not None:
                result.prompt_tokens = chunk.prompt_tokens
        result.text = "".join(parts)
        if not (finished or done):
            result.error = "stream ended before a finish_reason or [DONE]"
        elif not result.chunk_times:
            result.error = NO_TOKENS_ERROR


def _closed_before_response(err: httpx.HTTPError) -> bool:
    """Whether ``err`` (raised before a response's status line was read) means the
    connection was closed or reset under the request: httpcore says "Server disconnected
    without sending a response" for a clean close, and a reset is a read or write error.
    A connect error or a timeout is not one (the server may be down, or working)."""
    if isinstance(err, httpx.RemoteProtocolError):
        return "without sending a response" in str(err)
    return isinstance(err, httpx.ReadError | httpx.WriteError)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _snippet(value: Any) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return repr(text[:_SNIPPET_CHARS])


def _error_text(err: Any) -> str:
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return _snippet(err)


def _error_body(raw: bytes) -> str:
    """The message of an error response: OpenAI's ``{"error": {"message"}}``, FastAPI's
    ``{"detail"}``, or the start of the body."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return _snippet(raw) if raw else "empty body"
    if isinstance(obj, dict) and "error" in obj:
        return _error_text(obj["error"])
    if isinstance(obj, dict) and "detail" in obj:
        return _snippet(obj["detail"])
    return _snippet(raw)


def _describe(err: httpx.HTTPError) -> str:
    text = str(err)
    name = type(err).__name__
    return f"{name}: {text[:_SNIPPET_CHARS]}" if text else name
