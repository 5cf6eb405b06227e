"""Every error the gateway returns, mapped to a status code and OpenAI's error body in one
place: ``{"error": {"message", "type", "param", "code"}}``.

Engine errors map as: ``AdmissionError`` -> 400, ``OverloadedError`` -> 429 with
``Retry-After``, ``EngineDeadError`` -> 503, a request the engine failed -> 500. Any
other exception is a 500 whose message hides internals (they are logged instead).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.core import AdmissionError, EngineDeadError, OverloadedError
from orchestrator.gateway.async_engine import RequestFailedError
from orchestrator.gateway.protocol import ErrorDetail, ErrorResponse

logger = logging.getLogger(__name__)

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
    """An error response: status code, OpenAI error fields and extra headers."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return _TYPES_BY_STATUS.get(self.status_code, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        detail = ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=detail).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def to_api_error(exc: BaseException) -> APIError:
    """The API error for any exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, AdmissionError):
        return APIError(400, str(exc), code="request_not_admissible")
    if isinstance(exc, OverloadedError):
        retry_after = str(max(1, math.ceil(exc.retry_after_s)))
        return APIError(
            429, str(exc), code="server_overloaded", headers={"Retry-After": retry_after}
        )
    if isinstance(exc, EngineDeadError):
        return APIError(503, str(exc), code="engine_unavailable")
    if isinstance(exc, RequestFailedError):
        return APIError(500, str(exc), code="generation_failed")
    logger.error("unhandled error while serving a request", exc_info=exc)
    return APIError(500, "internal server error", code="internal_error")


def validation_error(exc: RequestValidationError) -> APIError:
    """400 naming the first invalid field (dotted path) and saying what is wrong."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request body")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        reason = first.get("ctx", {}).get("error", first.get("msg", ""))
        return APIError(400, f"request body is not valid JSON: {reason}", code="invalid_json")
    if not loc:
        # Missing, or not a JSON object (e.g. sent without Content-Type: application/json).
        return APIError(400, "the request body must be a JSON object", code="invalid_body")
    field = ".".join(loc)
    message = "unknown field" if kind == "extra_forbidden" else first.get("msg", "invalid")
    message = message.removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return APIError(400, f"{field}: {message}{more}", param=field, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    """Make every error FastAPI or a route raises answer in OpenAI's format."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        return to_api_error(exc).response()

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_error(exc).response()

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers or {})
        return APIError(exc.status_code, str(exc.detail), headers=headers).response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    # Anything else escapes to RequestIdMiddleware, which answers 500 in this format.
