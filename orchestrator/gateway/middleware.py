"""ASGI middleware that runs before any route: request ids, the request log line and the
body checks (size, UTF-8).

All are plain ASGI (not ``BaseHTTPMiddleware``) so that streaming responses and client
disconnects pass through untouched.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.gateway.errors import APIError, recorded_error

logger = logging.getLogger(__name__)
request_log = logging.getLogger("orchestrator.gateway.requests")

REQUEST_ID_HEADER = b"x-request-id"
# Probes and scrapes arrive every few seconds and are not API requests: no log line.
UNLOGGED_PATHS = frozenset({"/health", "/ready", "/metrics"})
_LOGGED = "request_logged"


def request_id(scope: Scope) -> str:
    """The id ``RequestIdMiddleware`` gave this request."""
    rid: str = scope["state"]["request_id"]
    return rid


def mark_logged(scope: Scope) -> None:
    """Tell ``RequestIdMiddleware`` that this request's log line was written (the serving
    layer writes a richer one for generation requests it accepted)."""
    scope.setdefault("state", {})[_LOGGED] = True


class RequestIdMiddleware:
    """Gives every HTTP request an id (``scope["state"]["request_id"]``), returns it as
    ``X-Request-Id`` on every response, answers an exception that escaped everything
    else with OpenAI's error body (a 500) rather than a bare text page, and writes one
    JSON line on the ``orchestrator.gateway.requests`` logger for every request that
    nothing else logged (4xx rejections included), except probes and scrapes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        started_at = time.monotonic()
        status: int | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER
                ]
                message = {**message, "headers": [*headers, (REQUEST_ID_HEADER, rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("request %s failed", rid)
            if status is not None:
                raise
            response = APIError(500, "internal server error", code="internal_error").response()
            await response(scope, receive, send_with_id)
        finally:
            if not state.get(_LOGGED) and scope["path"] not in UNLOGGED_PATHS:
                self._log(scope, rid, status, time.monotonic() - started_at)

    @staticmethod
    def _log(scope: Scope, rid: str, status: int | None, elapsed_s: float) -> None:
        entry: dict[str, Any] = {
            "request_id": rid,
            "method": scope["method"],
            "path": scope["path"],
            # No response started: the client left before one was ready.
            "status": status if status is not None else 499,
            "total_s": round(elapsed_s, 4),
        }
        error = recorded_error(scope)
        if error is not None:
            entry["error"] = error.message
            if error.param is not None:
                entry["param"] = error.param
        request_log.info(json.dumps(entry))


class RequestBodyMiddleware:
    """Checks a request body before anything parses it: over ``max_bytes`` is a 413, and
    bytes that are not UTF-8 (which JSON requires) a 400.

    A declared ``Content-Length`` over the limit is refused without reading; otherwise
    the body is read (up to the limit) and replayed to the application.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> APIError:
        return APIError(
            413, f"request body is over the limit of {self.max_bytes} bytes", code="body_too_large"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large().send(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large().send(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as err:
            error = APIError(
                400,
                f"request body is not valid UTF-8 (byte {err.start}); JSON text must be UTF-8",
                code="invalid_json",
            )
            await error.send(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
