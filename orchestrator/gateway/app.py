"""The FastAPI application: routes, error mapping, middleware and the engine's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping

from fastapi import FastAPI

from orchestrator.common.async_engine import AsyncEngine
from orchestrator.gateway.auth import APIKeyMiddleware, configured_keys
from orchestrator.gateway.config import ServeConfig
from orchestrator.gateway.errors import install_error_handlers
from orchestrator.gateway.lifecycle import GatewayLifecycle, Loader
from orchestrator.gateway.metrics import GatewayMetrics
from orchestrator.gateway.middleware import RequestBodyMiddleware, RequestIdMiddleware
from orchestrator.gateway.openapi import install_openapi
from orchestrator.gateway.protocol.chat import ChatCompletionRequest
from orchestrator.gateway.protocol.completions import CompletionRequest
from orchestrator.gateway.routes import router
from orchestrator.gateway.serving import OpenAIServing, ServingLimits
from orchestrator.gateway.tokenizer import Tokenizer
from orchestrator.gateway.tool_parsers import tool_parser

API_DESCRIPTION = (
    "OpenAI's completions and chat completions. Every error is "
    '`{"error": {"message", "type", "param", "code"}}`; an invalid field is a 400 whose '
    "`param` names it. Request fields the server cannot honour are accepted only at values "
    "that change nothing (see each field's description)."
)


def create_app(
    config: ServeConfig, loader: Loader, environ: Mapping[str, str] = os.environ
) -> FastAPI:
    """An app serving ``config.model.name``. ``loader`` builds the engine core and the
    tokenizer; it runs in a background thread at startup, so ``/health`` answers while
    the model loads. API keys are read from ``config.server`` and ``environ``."""
    server = config.server
    lifecycle: GatewayLifecycle
    metrics = GatewayMetrics(
        lambda: lifecycle.engine_stats(),
        config.model.name,
        lambda: lifecycle.executor_platform(),
        config.cache,
    )

    def make_serving(engine: AsyncEngine, tokenizer: Tokenizer) -> OpenAIServing:
        return OpenAIServing(
            engine,
            tokenizer,
            config.model.name,
            metrics,
            lifecycle.in_flight,
            log_prompts=server.log_prompts,
            limits=ServingLimits(server.default_chat_max_tokens, server.max_tokens_limit),
            tenant_classes=server.tenant_slo_classes,
            tool_parser=tool_parser(server.tool_call_parser),
            objectives=server.objectives,
        )

    lifecycle = GatewayLifecycle(make_serving)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(lifecycle.load(loader))
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await lifecycle.shutdown()

    app = FastAPI(
        title="orchestrator",
        summary="OpenAI-compatible inference gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.lifecycle = lifecycle
    app.state.metrics = metrics
    app.state.model_name = config.model.name
    install_error_handlers(app)
    app.include_router(router)
    install_openapi(app, API_DESCRIPTION, [CompletionRequest, ChatCompletionRequest])
    # Added innermost first: request id (outermost) -> API key -> body checks.
    app.add_middleware(RequestBodyMiddleware, max_bytes=server.max_body_bytes)
    keys = configured_keys(server, environ)
    if keys:
        app.add_middleware(APIKeyMiddleware, keys=keys)
    app.add_middleware(RequestIdMiddleware)
    return app
