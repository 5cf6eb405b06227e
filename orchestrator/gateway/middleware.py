"""ASGI middleware that runs before any route: request ids and the body-size limit.

Both are plain ASGI (not ``BaseHTTPMiddleware``) so that streaming responses and
client disconnects pass through untouched.
"""

from __future__ import annotations

import logging
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.gateway.errors import APIError

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = b"x-request-id"


def request_id(scope: Scope) -> str:
    """The id ``RequestIdMiddleware`` gave this request."""
    rid: str = scope["state"]["request_id"]
    return rid


class RequestIdMiddleware:
    """Gives every HTTP request an id (``scope["state"]["request_id"]``), returns it as
    ``X-Request-Id`` on every response, and answers an exception that escaped everything
    else with OpenAI's error body (a 500) rather than a bare text page."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER
                ]
                message = {**message, "headers": [*headers, (REQUEST_ID_HEADER, rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("request %s failed", rid)
            if started:
                raise
            response = APIError(500, "internal server error", code="internal_error").response()
            await response(scope, receive, send_with_id)


class BodySizeLimitMiddleware:
    """Rejects a request body over ``max_bytes`` with 413 before anything parses it.

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
            await self._too_large().response()(scope, receive, send)
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
                await self._too_large().response()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
