"""HTTP routes: each one unpacks the request and hands it to the serving layer."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from orchestrator.gateway.lifecycle import GatewayLifecycle
from orchestrator.gateway.metrics import GatewayMetrics
from orchestrator.gateway.middleware import request_id
from orchestrator.gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from orchestrator.gateway.serving import CallInfo, OpenAIServing

router = APIRouter()


def _lifecycle(request: Request) -> GatewayLifecycle:
    lifecycle: GatewayLifecycle = request.app.state.lifecycle
    return lifecycle


def _call(request: Request, serving: OpenAIServing) -> CallInfo:
    return CallInfo(
        request_id=request_id(request.scope),
        arrival_time=serving.now(),
        priority_header=request.headers.get("x-priority"),
        http=request,
    )


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive and serving HTTP (the model may still be loading)."""
    return {"status": "ok"}


@router.get("/ready")
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


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry: GatewayMetrics = request.app.state.metrics
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(request: Request) -> ModelList:
    return ModelList(data=[ModelCard(id=request.app.state.model_name)])


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    serving = _lifecycle(request).serving_or_503()
    return await serving.completions(body, _call(request, serving))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    serving = _lifecycle(request).serving_or_503()
    return await serving.chat(body, _call(request, serving))
