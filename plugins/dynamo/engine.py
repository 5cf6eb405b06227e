"""Our engine as an NVIDIA Dynamo backend worker: an implementation of Dynamo's unified
``LLMEngine`` contract (``dynamo/common/backend/engine.py``) over the same
``EngineCore`` ``orchestrator serve`` builds from a serve config.

Dynamo's frontend owns HTTP, tokenisation, chat templates, stop strings and
detokenisation; it sends each worker token ids and reads token ids back. Everything
between is ours: admission, priorities, SLO classes, tenants' fair share, preemption,
the prefix cache and structured-output constraints decide every step, as behind our
own gateway. The core's steps run off the event loop, in the engine thread of the
``AsyncEngine`` our gateway serves through (``orchestrator/common/async_engine.py``). Imported
only by ``orchestrator dynamo-worker``: Dynamo is imported at the top.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import threading
import uuid
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any, cast

from dynamo._core import Context
from dynamo.common.backend.engine import EngineConfig as DynamoEngineConfig
from dynamo.common.backend.engine import (
    GenerateChunk,
    GenerateRequest,
    LLMEngine,
    LlmRegistration,
)
from dynamo.common.backend.metrics import register_engine_registry
from dynamo.common.backend.publisher import ComponentSnapshot, KvEventSource, PushSource
from dynamo.common.backend.worker import WorkerConfig
from dynamo.common.configuration.groups.runtime_args import (
    DynamoRuntimeArgGroup,
    DynamoRuntimeConfig,
)
from dynamo.common.utils.runtime import parse_endpoint
from dynamo.llm import ModelInput
from dynamo.llm import exceptions as dynamo_exceptions
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.common.async_engine import AsyncEngine, RequestAbortedError
from orchestrator.common.engine_metrics import engine_metric_families
from orchestrator.core import EngineConfig, EngineCore, EngineError, FinishReason, RequestOutput
from plugins.dynamo.kv_events import DynamoKVEventSink
from plugins.dynamo.model_folder import ensure_model_folder
from plugins.dynamo.protocol import (
    RequestLimits,
    UnsupportedFieldError,
    map_error,
    to_chunk,
    to_exception,
    to_submission,
)
from plugins.dynamo.settings import WorkerSettings, load_worker_config

logger = logging.getLogger(__name__)

DEFAULT_COMPONENT = "backend"
DEFAULT_ENDPOINT = "generate"
# How often the load snapshot the KV router reads is refreshed (s).
SNAPSHOT_INTERVAL_S = 0.25
# While draining before cleanup, how often the live requests are counted (s).
DRAIN_POLL_S = 0.1


class _WorkerMetrics(Collector):
    """The engine's gauges and counters under the names ``orchestrator serve`` exports
    them (``engine_metric_families``), and the worker's prompt-token counters: the per-worker facts behind KV-aware routing's hit
    rate (a client sees its own request's share as
    ``usage.prompt_tokens_details.cached_tokens``)."""

    def __init__(self, engine: AsyncEngine | None = None) -> None:
        self.engine = engine
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "orchestrator_prompt_tokens",
            "Prompt tokens of finished requests since start.",
            value=self.prompt_tokens,
        )
        yield CounterMetricFamily(
            "orchestrator_prompt_tokens_cached",
            "Prompt tokens of finished requests served from the prefix cache since start.",
            value=self.cached_prompt_tokens,
        )
        if self.engine is None:  # the engine is still loading
            return
        yield from engine_metric_families(self.engine.stats())


class _RuntimeConfig(DynamoRuntimeConfig):
    """Dynamo's runtime settings plus the component, which ``WorkerConfig`` reads and
    ``--endpoint dyn://NAMESPACE.COMPONENT.ENDPOINT`` sets (as Dynamo's own backends do)."""

    component: str = DEFAULT_COMPONENT


def build_parser() -> argparse.ArgumentParser:
    """``--config`` and ``--model-dir``, then Dynamo's own runtime flags (each with its
    ``DYN_*`` variable: namespace, endpoint, discovery backend, request, response and
    event planes, ...)."""
    parser = argparse.ArgumentParser(
        prog="orchestrator dynamo-worker",
        description="Serve a serve config's engine as an NVIDIA Dynamo backend worker.",
        allow_abbrev=False,
    )
    parser.add_argument("--config", required=True, help="serve config (YAML)")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="where the model's Hugging Face folder for Dynamo's frontend is written "
        "(default: $XDG_CACHE_HOME/orchestrator/dynamo-models)",
    )
    DynamoRuntimeArgGroup().add_arguments(parser)
    return parser


class OrchestratorEngine(LLMEngine):
    """Dynamo's ``LLMEngine`` over our ``EngineCore``: token ids in, token ids out."""

    def __init__(self, config: EngineConfig, settings: WorkerSettings, model_dir: Path) -> None:
        self.config = config
        self.settings = settings
        self.model_dir = model_dir
        self.limits: RequestLimits | None = None  # known once the core is built
        self.engine: AsyncEngine | None = None
        self._sink = DynamoKVEventSink()
        self._kv_events = False
        self._metrics = _WorkerMetrics()
        self._token_text: Any = None
        self._snapshots: Any = None
        self._snapshot_stop = threading.Event()
        self._snapshot_thread: threading.Thread | None = None
        self._crash_watch: asyncio.Task[None] | None = None

    @classmethod
    async def from_args(
        cls, argv: list[str] | None = None
    ) -> tuple[OrchestratorEngine, WorkerConfig]:
        args = build_parser().parse_args(argv)
        config, settings = load_worker_config(args.config)
        runtime = _RuntimeConfig.from_cli_args(args)
        runtime.validate()
        endpoint = (
            runtime.endpoint or f"dyn://{runtime.namespace}.{DEFAULT_COMPONENT}.{DEFAULT_ENDPOINT}"
        )
        runtime.namespace, runtime.component, runtime.endpoint = parse_endpoint(endpoint)
        # Loading the tokenizer takes seconds; off the event loop.
        model_dir = await asyncio.to_thread(ensure_model_folder, config.model, args.model_dir)
        engine = cls(config, settings, model_dir)
        worker_config = WorkerConfig.from_runtime_config(
            runtime,
            model_name=str(model_dir),
            served_model_name=config.model.name,
            model_input=ModelInput.Tokens,
        )
        return engine, worker_config

    async def start(self, worker_id: int) -> DynamoEngineConfig:
        del worker_id
        config = self.config
        core = await asyncio.to_thread(self._build_core)
        self.limits = RequestLimits(
            max_model_len=core.max_model_len,
            max_tokens_limit=self.settings.max_tokens_limit,
            tenant_slo_classes=dict(self.settings.tenant_slo_classes),
        )
        if config.kv_events is not None:
            logger.warning(
                "kv_events (%s) is not used by dynamo-worker: KV events go to Dynamo's router",
                config.kv_events.type,
            )
        # Without prefix caching nothing is cached, so there is nothing to route on.
        self._kv_events = config.cache.enable_prefix_caching
        if self._kv_events:
            core.attach_kv_event_sink(self._sink)
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        self._token_text = lambda token_id: tokenizer.decode([token_id])
        engine = AsyncEngine(core)
        engine.start()
        self.engine = engine
        self._metrics.engine = engine
        self._crash_watch = asyncio.get_running_loop().create_task(self._exit_on_crash())
        stats = engine.stats()
        logger.info(
            "engine ready: %d KV blocks of %d tokens, context %d tokens",
            stats.kv_blocks_total,
            config.cache.block_size,
            core.max_model_len,
        )
        return DynamoEngineConfig(
            model=str(self.model_dir),
            served_model_name=config.model.name,
            llm=LlmRegistration(
                context_length=core.max_model_len,
                kv_cache_block_size=config.cache.block_size,
                total_kv_blocks=stats.kv_blocks_total,
                max_num_seqs=config.scheduler.max_batch_size,
                max_num_batched_tokens=config.scheduler.max_num_tokens,
            ),
        )

    def _build_core(self) -> EngineCore:
        core = EngineCore.from_config(self.config)
        core.calibrate_predictor(self.config)
        return core

    async def _exit_on_crash(self) -> None:
        """A dead engine serves nothing: stop the worker (Dynamo's own SIGTERM path:
        unregister, drain, cleanup), so the frontend routes to the other workers."""
        assert self.engine is not None
        await self.engine.crashed.wait()
        logger.error("the engine loop stopped; shutting the worker down")
        os.kill(os.getpid(), signal.SIGTERM)

    async def kv_event_sources(self) -> list[KvEventSource]:
        return [PushSource(on_ready=self._sink.connect, dp_rank=0)] if self._kv_events else []

    def component_metrics_dp_ranks(self) -> list[int]:
        return [0]

    def attach_snapshot_publisher(self, publisher: Any) -> None:
        self._snapshots = publisher
        self._snapshot_thread = threading.Thread(
            target=self._publish_snapshots, name="dynamo-load-snapshots", daemon=True
        )
        self._snapshot_thread.start()

    def _publish_snapshots(self) -> None:
        """The KV router's load input (blocks used) and Dynamo's per-worker gauges, every
        ``SNAPSHOT_INTERVAL_S`` until cleanup."""
        while not self._snapshot_stop.wait(SNAPSHOT_INTERVAL_S):
            engine = self.engine
            if engine is None:
                continue
            stats = engine.stats()
            counters = self._metrics
            hit_rate = (
                counters.cached_prompt_tokens / counters.prompt_tokens
                if counters.prompt_tokens
                else None
            )
            try:
                self._snapshots.publish(
                    0,
                    ComponentSnapshot(
                        kv_used_blocks=stats.kv_blocks_used,
                        kv_total_blocks=stats.kv_blocks_total,
                        gpu_cache_usage=stats.kv_blocks_used / max(1, stats.kv_blocks_total),
                        dp_rank=0,
                        kv_cache_hit_rate=hit_rate,
                    ),
                )
            except Exception:
                logger.exception("publishing the load snapshot failed")

    async def register_prometheus(self, metrics: Any) -> None:
        """Our ``orchestrator_*`` engine gauges and the worker's prompt-token counters,
        on the worker's Dynamo system port (``DYN_SYSTEM_PORT``)."""
        registry = CollectorRegistry(auto_describe=True)
        registry.register(self._metrics)
        register_engine_registry(metrics, registry)

    async def generate(
        self, request: GenerateRequest, context: Context
    ) -> AsyncGenerator[GenerateChunk, None]:
        engine, limits = self.engine, self.limits
        if engine is None or limits is None:
            raise dynamo_exceptions.EngineShutdown("the engine is not running")
        request_id = context.id() or uuid.uuid4().hex
        try:
            submission = to_submission(request, request_id, engine.clock.now(), limits)
            stream = await engine.submit(submission)
        except (UnsupportedFieldError, EngineError) as exc:
            raise to_exception(map_error(exc), dynamo_exceptions) from None
        # Leaving the block (Dynamo stopped reading: the client is gone; or the request
        # failed) aborts a request that has not finished: its KV blocks are free before
        # the next step.
        async with stream:
            try:
                async for item in stream:
                    if item.finished:
                        self._note_finished(request_id, item)
                    yield cast(GenerateChunk, to_chunk(item, self._token_text))
            except RequestAbortedError:
                yield {"token_ids": [], "index": 0, "finish_reason": "cancelled"}
            except EngineError as exc:  # ended by the engine: shed, failed, a bad constraint
                raise to_exception(map_error(exc), dynamo_exceptions) from None

    def _note_finished(self, request_id: str, output: RequestOutput) -> None:
        prompt_tokens = output.num_prompt_tokens
        self._metrics.prompt_tokens += prompt_tokens
        self._metrics.cached_prompt_tokens += output.num_cached_tokens
        reason = output.finish_reason or FinishReason.STOP
        # One line per request: which worker served it and what its prefix cache held.
        logger.info(
            "request %s finished (%s): prompt_tokens=%d cached_tokens=%d output_tokens=%d",
            request_id,
            reason,
            prompt_tokens,
            output.num_cached_tokens,
            output.num_output_tokens,
        )

    async def abort(self, context: Context) -> None:
        """Free the request's KV blocks before the engine's next step; Dynamo then stops
        reading its ``generate``."""
        request_id = context.id()
        if request_id and self.engine is not None:
            self.engine.abort(request_id, RequestAbortedError(f"request {request_id} was aborted"))
            logger.info(
                "request %s aborted: its KV blocks are freed before the next step", request_id
            )

    async def cleanup(self) -> None:
        """Wait (up to ``server.drain_timeout_s``) for requests in flight, then stop the
        engine's steps and the executor. Safe after a failed ``start`` and when called
        twice."""
        self._sink.close()
        self._snapshot_stop.set()
        if self._snapshot_thread is not None:
            await asyncio.to_thread(self._snapshot_thread.join, 5.0)
            self._snapshot_thread = None
        if self._crash_watch is not None:
            self._crash_watch.cancel()
            self._crash_watch = None
        engine, self.engine = self.engine, None
        if engine is None:
            return
        polls = int(self.settings.drain_timeout_s / DRAIN_POLL_S)
        for _ in range(polls):
            if engine.num_live_requests == 0 or not engine.is_running:
                break
            await asyncio.sleep(DRAIN_POLL_S)
        await engine.shutdown()
