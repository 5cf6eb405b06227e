"""Every error the gateway returns, mapped to a status code and OpenAI's error body in one
place: ``{"error": {"message", "type", "param", "code"}}``.

Engine errors map as: ``AdmissionError`` -> 400 (``param`` the field at fault),
``InvalidConstraintError`` (a schema or grammar the engine could not compile) -> 400
naming the field it came from,
``OverloadedError`` -> 429 with ``Retry-After`` and the engine's reason as ``code``,
``RequestShedError`` (ended past its TTFT deadline before a token) -> 503 with its reason
as ``code``, ``EngineDeadError`` -> 503, a request the engine failed or could not
accept -> 500. The 429 and the shed 503 also carry llm-d's
``x-llm-d-request-dropped-reason`` (``DROPPED_REASON_HEADER``). Any other exception is a 500. No error body carries an internal exception
text: the engine's own reasons travel as ``APIError.detail``, which only the request log
line shows.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from orchestrator.common.async_engine import (
    InvalidConstraintError,
    RequestFailedError,
    RequestShedError,
    SubmissionFailedError,
)
from orchestrator.core import AdmissionError, EngineDeadError, OverloadedError
from orchestrator.gateway.protocol.shared import ErrorDetail, ErrorResponse

logger = logging.getLogger(__name__)

# llm-d's response header saying why a request was dropped, and the two of its values
# (pkg/common/error/error.go in llm-d/llm-d-router) that fit: ``rejected-saturated``
# for a refusal at admission (no capacity for it now, whatever our engine's reason,
# which the body's ``code`` carries), ``evicted`` for a request the server accepted and
# then ended before serving it. Clients branch on these values, so none is invented.
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
DROPPED_SATURATED = "rejected-saturated"
DROPPED_EVICTED = "evicted"

_TYPES_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error response: status code, OpenAI error fields and extra headers.
    ``detail`` is for the server's log only, never for the response."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.detail = detail

    @property
    def type(self) -> str:
        return _TYPES_BY_STATUS.get(self.status_code, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=detail).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)

    async def send(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer with this error from ASGI middleware, recording it for the log line."""
        record_error(scope, self)
        await self.response()(scope, receive, send)


_ERROR_KEY = "api_error"


def record_error(scope: Scope, error: APIError) -> None:
    """Remember the error a request is answered with, for its log line."""
    scope.setdefault("state", {})[_ERROR_KEY] = error


def recorded_error(scope: Scope) -> APIError | None:
    error = scope.get("state", {}).get(_ERROR_KEY)
    return error if isinstance(error, APIError) else None


def to_api_error(exc: BaseException) -> APIError:
    """The API error for any exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, AdmissionError):
        return APIError(400, str(exc), param=exc.param, code="request_not_admissible")
    if isinstance(exc, OverloadedError):
        headers = {
            "Retry-After": str(exc.retry_after_header_s),
            DROPPED_REASON_HEADER: DROPPED_SATURATED,
        }
        return APIError(429, str(exc), code=exc.code, headers=headers)
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), code="engine_unavailable")
    if isinstance(exc, InvalidConstraintError):
        # The client's schema or grammar is at fault, not the server.
        message = f"{exc.param}: {exc}" if exc.param else str(exc)
        return APIError(400, message, param=exc.param, code="invalid_constraint")
    if isinstance(exc, RequestShedError):
        # A deliberate, temporary refusal (the server is behind), not a server fault.
        return APIError(
            503, str(exc), code=exc.code, headers={DROPPED_REASON_HEADER: DROPPED_EVICTED}
        )
    if isinstance(exc, RequestFailedError):
        return APIError(500, str(exc), code="generation_failed", detail=exc.detail)
    if isinstance(exc, SubmissionFailedError):
        return APIError(500, str(exc), code="submission_failed")
    logger.error("unhandled error while serving a request", exc_info=exc)
    return APIError(500, "internal server error", code="internal_error")


# Union members and wrapped validators appear in pydantic's error paths as tags such as
# ``str``, ``list[int]``, ``constrained-str`` or ``function-after[...]``; they are not
# fields the client sent (no field of the API has ``-`` or ``[`` in its name).
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "null"})
_JSON_TYPES: dict[type, str] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "an array",
    dict: "an object",
    type(None): "null",
}
# Header parameters, by the lower-case name FastAPI reports, as clients spell them.
_HEADERS = {"x-priority": "X-Priority"}


def _is_tag(part: str) -> bool:
    return part in _TYPE_TAGS or "[" in part or "-" in part


def _param(loc: tuple[int | str, ...]) -> str:
    """The dotted field path of a pydantic error location, without its ``body``/``header``
    prefix and the union tags."""
    if loc and loc[0] == "header":
        name = str(loc[1]) if len(loc) > 1 else ""
        return _HEADERS.get(name.lower(), name)
    parts = [str(p) for p in loc[1:] if not _is_tag(str(p))]
    return ".".join(parts)


def validation_error(exc: RequestValidationError) -> APIError:
    """400 naming the first invalid field (dotted path) and saying what is wrong."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request body")
    first = errors[0]
    kind = first.get("type", "")
    ctx = first.get("ctx") or {}
    if kind == "json_invalid":
        reason = ctx.get("error", first.get("msg", ""))
        return APIError(400, f"request body is not valid JSON: {reason}", code="invalid_json")
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    field = _param(tuple(first.get("loc", ())))
    if isinstance(ctx.get("param"), str):
        # A rule across fields, raised by the model at ``loc``: the message names them.
        field = f"{field}.{ctx['param']}" if field else ctx["param"]
        message = str(first.get("msg", "invalid"))
        return APIError(400, f"{field}: {message}{more}", param=field, code="invalid_value")
    if not field:
        # Missing, or not a JSON object (e.g. sent without Content-Type: application/json).
        return APIError(400, "the request body must be a JSON object", code="invalid_body")
    message = "unknown field" if kind == "extra_forbidden" else str(first.get("msg", "invalid"))
    message = message.removeprefix("Value error, ")
    if kind.endswith("_type") and "input" in first:
        got = _JSON_TYPES.get(type(first["input"]), "another type")
        message = f"{message}, got {got}"
    return APIError(400, f"{field}: {message}{more}", param=field, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    """Make every error FastAPI or a route raises answer in OpenAI's format."""

    def answer(request: Request, error: APIError) -> JSONResponse:
        record_error(request.scope, error)
        return error.response()

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        return answer(request, to_api_error(exc))

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return answer(request, validation_error(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        return answer(request, APIError(exc.status_code, str(exc.detail), headers=headers))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    # Anything else escapes to RequestIdMiddleware, which answers 500 in this format.
