"""Running the gateway under uvicorn, with a graceful drain on SIGTERM.

uvicorn's own SIGTERM handling closes the listening socket at once; here SIGTERM starts
a drain instead: ``/ready`` turns 503 and new generation requests get 503 while the
socket stays open, requests in flight finish (up to ``server.drain_timeout_s``), the rest
are ended, and the process exits 0. SIGINT, or a second SIGTERM, skips the drain.

However the server stops, before uvicorn closes connections every request still in
flight is ended by the server: a stream gets a final error event and ``data: [DONE]``,
a whole response a 503, each logged as a server-side end (503, not a client's 499), so
no task is left for uvicorn to cancel. Only a forced exit (a third signal) skips that.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from orchestrator.core import EngineConfig
from orchestrator.gateway.app import create_app
from orchestrator.gateway.config import ServeConfig
from orchestrator.gateway.lifecycle import GatewayLifecycle, LoadedModel, Loader
from orchestrator.gateway.tokenizer import HFTokenizer

logger = logging.getLogger(__name__)

# Once drained, how long uvicorn waits for idle keep-alive connections to close (s).
CONNECTION_CLOSE_TIMEOUT_S = 5
SHUTDOWN_REASON = "the server is shutting down"


def load_model(config: EngineConfig) -> LoadedModel:
    """The engine core with the configured executor, its step-time predictor calibrated
    on it (before ``/ready``: the engine starts once this returns), and the model's
    tokenizer. The engine sends its KV events to the sink ``kv_events`` names, if any,
    and closes it when it shuts down."""
    from orchestrator.common.model_source import load_tokenizer
    from orchestrator.core import EngineCore, create_kv_event_sink

    tokenizer = HFTokenizer(load_tokenizer(config.model))
    core = EngineCore.from_config(config)
    sink = create_kv_event_sink(config)
    if sink is not None:
        core.attach_kv_event_sink(sink)
    core.calibrate_predictor(config)
    return LoadedModel(core, tokenizer)


class GatewayServer(uvicorn.Server):
    """uvicorn with a drain on SIGTERM, and exit code 1 when the model fails to load or
    the engine loop crashes (``exit_code``)."""

    def __init__(
        self, config: uvicorn.Config, lifecycle: GatewayLifecycle, drain_timeout_s: float
    ) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.drain_timeout_s = drain_timeout_s
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._spawn(self._exit_on_fatal())
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM: drain; a second one: stop now (``shutdown`` ends what is in flight); a
        third: force. Other signals as uvicorn handles them. Safe from any thread."""
        # SIGTERM is not recorded as a captured signal: uvicorn would re-raise it on the
        # way out and the process would die by SIGTERM instead of exiting 0.
        if sig != signal.SIGTERM:
            super().handle_exit(sig, frame)
        elif self.should_exit:
            self.force_exit = True
        elif self.lifecycle.draining or self._loop is None:
            self.should_exit = True
        else:
            self._loop.call_soon_threadsafe(self._spawn, self.drain_and_exit())

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """End every request still in flight (error event or 503), then uvicorn's own
        shutdown: connections close, the lifespan stops the engine."""
        if not self.force_exit:
            await self.lifecycle.end_requests(SHUTDOWN_REASON)
        await super().shutdown(sockets)

    async def drain_and_exit(self) -> None:
        await self.lifecycle.drain(self.drain_timeout_s)
        logger.info("drained; shutting down")
        self.should_exit = True

    async def _exit_on_fatal(self) -> None:
        await self.lifecycle.fatal.wait()
        self.exit_code = 1
        self.should_exit = True

    def _spawn(self, coro: object) -> None:
        assert asyncio.iscoroutine(coro)
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # keep a reference until done
        task.add_done_callback(self._tasks.discard)


def build_server(
    config: ServeConfig,
    host: str | None = None,
    port: int | None = None,
    loader: Loader | None = None,
) -> GatewayServer:
    """The server for ``config``; ``host``/``port`` override ``config.server``."""
    app = create_app(config, loader or (lambda: load_model(config)))
    uv_config = uvicorn.Config(
        app,
        host=host or config.server.host,
        port=config.server.port if port is None else port,
        access_log=False,  # the serving layer logs one structured line per request
        log_config=None,
        timeout_graceful_shutdown=CONNECTION_CLOSE_TIMEOUT_S,
    )
    return GatewayServer(uv_config, app.state.lifecycle, config.server.drain_timeout_s)


def serve(config: ServeConfig, host: str | None = None, port: int | None = None) -> int:
    """Serve until stopped; the exit code."""
    server = build_server(config, host, port)
    server.run()
    return server.exit_code
