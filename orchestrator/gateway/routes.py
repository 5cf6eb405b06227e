"""Thin HTTP routes: parse, hand to the serving layer, return. Each declares what it
answers, so ``/openapi.json`` states the real statuses, error body and media types."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, BeforeValidator

from orchestrator.gateway.job import CallInfo
from orchestrator.gateway.lifecycle import GatewayLifecycle
from orchestrator.gateway.metrics import GatewayMetrics
from orchestrator.gateway.middleware import request_id
from orchestrator.gateway.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from orchestrator.gateway.protocol.completions import CompletionRequest, CompletionResponse
from orchestrator.gateway.protocol.shared import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from orchestrator.gateway.serving import OpenAIServing

router = APIRouter()

ERROR_STATUSES: dict[int, str] = {
    400: "Invalid request: the error's `param` names the field.",
    401: "API keys are configured and the bearer key is missing or wrong.",
    404: "Unknown `model`.",
    405: "Method not allowed on this path.",
    413: "The body is over `server.max_body_bytes`.",
    429: "Refused at admission (queue limits, or a TTFT its SLO target would miss); "
    "`Retry-After` says when to retry, `x-llm-d-request-dropped-reason` is "
    "`rejected-saturated`. Nothing was queued.",
    500: "The engine could not complete this request (others are unaffected).",
    503: "The model is loading, the server is draining, or the engine stopped.",
}
# One server-sent event (OpenAPI before 3.2 describes each event with `schema`).
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "string",
            "description": "A chunk as JSON (the response model's shape, one choice's delta), "
            'or `{"error": ...}` when the request fails after the first chunk, or `[DONE]` '
            "as the last event.",
        }
    },
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorResponse, "description": ERROR_STATUSES[s]} for s in statuses}


def _generation_responses(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "model": model,
            "description": "The whole response, or with `stream: true` its chunks as SSE.",
            "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
        },
        **_errors(400, 401, 404, 405, 413, 429, 500, 503),
    }


class HealthStatus(BaseModel):
    status: Literal["ok"]


class ReadyStatus(BaseModel):
    status: Literal["ready", "loading", "load failed", "draining", "engine stopped"]


_INTEGER = re.compile(r"-?[0-9]+")


def _integer_text(value: object) -> object:
    """A header arrives as text; only a plain integer (``-3``, ``7``) is one here. Without
    this, lax parsing read ``+0.0`` as 0 while the OpenAPI schema says integer."""
    if isinstance(value, str) and not _INTEGER.fullmatch(value.strip()):
        raise ValueError("must be an integer, such as 0 or -2")
    return value


PriorityHeader = Annotated[
    int | None,
    Header(
        alias="X-Priority",
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="Priority when the body has none (lower is served first).",
    ),
    BeforeValidator(_integer_text),
]


def _lifecycle(request: Request) -> GatewayLifecycle:
    lifecycle: GatewayLifecycle = request.app.state.lifecycle
    return lifecycle


def _call(request: Request, serving: OpenAIServing, priority: int | None) -> CallInfo:
    return CallInfo(
        request_id=request_id(request.scope),
        arrival_time=serving.now(),
        priority_header=priority,
        http=request,
    )


@router.get("/health")
async def health() -> HealthStatus:
    """The process is alive and serving HTTP (the model may still be loading)."""
    return HealthStatus(status="ok")


@router.get(
    "/ready",
    response_model=ReadyStatus,
    responses={503: {"model": ReadyStatus, "description": "Not ready: the status says why."}},
)
async def ready(request: Request) -> JSONResponse:
    """200 once the model is loaded and the engine loop runs; 503 while loading, while
    draining, or after the engine stopped."""
    lifecycle = _lifecycle(request)
    if lifecycle.ready:
        return JSONResponse({"status": "ready"})
    if lifecycle.draining:
        status = "draining"
    elif lifecycle.engine is None:
        status = "load failed" if lifecycle.fatal.is_set() else "loading"
    else:
        status = "engine stopped"
    return JSONResponse({"status": status}, status_code=503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics, including the gauges an inference router reads."""
    registry: GatewayMetrics = request.app.state.metrics
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", responses=_errors(401))
async def models(request: Request) -> ModelList:
    return ModelList(data=[ModelCard(id=request.app.state.model_name)])


@router.post(
    "/v1/completions", response_model=None, responses=_generation_responses(CompletionResponse)
)
async def completions(
    body: CompletionRequest, request: Request, x_priority: PriorityHeader = None
) -> Response:
    serving = _lifecycle(request).serving_or_503()
    return await serving.completions(body, _call(request, serving, x_priority))


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses=_generation_responses(ChatCompletionResponse),
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, x_priority: PriorityHeader = None
) -> Response:
    serving = _lifecycle(request).serving_or_503()
    return await serving.chat(body, _call(request, serving, x_priority))
