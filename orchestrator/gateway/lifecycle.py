"""Server lifecycle: loading the model in the background, readiness, and graceful drain.

``/health`` answers as soon as the process serves HTTP; ``/ready`` only once the model
is loaded and the engine loop runs, and no longer once a drain has begun. A drain stops
new generation requests (503), lets those in flight finish for up to the drain timeout,
then ends the rest (``end_requests``): a stream gets a final error event and
``data: [DONE]``, a whole response a 503, and each is logged as the server's own end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.common.async_engine import AsyncEngine
from orchestrator.core import EngineCore, EngineDeadError, EngineStats
from orchestrator.gateway.errors import APIError
from orchestrator.gateway.tokenizer import Tokenizer

if TYPE_CHECKING:
    from orchestrator.gateway.serving import OpenAIServing

logger = logging.getLogger(__name__)

# After a drain's abort, how long streams get to send their final error chunk (s).
ABORT_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """What a loader returns: an engine core (not yet running) and its tokenizer."""

    core: EngineCore
    tokenizer: Tokenizer


Loader = Callable[[], LoadedModel]


class InFlight:
    """Counts generation requests between admission and their last byte; once closed
    (draining) it refuses new ones with 503."""

    def __init__(self) -> None:
        self.count = 0
        self.closed = False
        self._idle = asyncio.Event()
        self._idle.set()

    def acquire(self) -> None:
        if self.closed:
            raise APIError(503, "the server is shutting down", code="draining")
        self.count += 1
        self._idle.clear()

    def release(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


class GatewayLifecycle:
    """Holds the engine once it is loaded, and the gateway's ready/draining state.

    ``fatal`` is set when the server cannot go on (the model failed to load, or the
    engine loop crashed); whoever runs the server exits with an error then.
    """

    def __init__(self, make_serving: Callable[[AsyncEngine, Tokenizer], OpenAIServing]) -> None:
        self._make_serving = make_serving
        self.engine: AsyncEngine | None = None
        self.serving: OpenAIServing | None = None
        self.in_flight = InFlight()
        self.fatal = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        return self.in_flight.closed

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.is_running and not self.draining

    def engine_stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    def executor_platform(self) -> tuple[tuple[str, str], ...]:
        """The executor's ``info().platform`` labels; empty while no engine runs."""
        return self.engine.core.info.platform if self.engine is not None else ()

    def serving_or_503(self) -> OpenAIServing:
        if self.serving is None:
            if self.fatal.is_set():
                raise APIError(503, "the model failed to load", code="load_failed")
            raise APIError(503, "the model is still loading", code="loading")
        return self.serving

    async def load(self, loader: Loader) -> None:
        """Load the model off the event loop and start the engine; on failure, set
        ``fatal``. A daemon thread, so a process told to stop while loading can exit."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[LoadedModel] = loop.create_future()

        def run() -> None:
            try:
                outcome: tuple[LoadedModel | None, Exception | None] = (loader(), None)
            except Exception as exc:
                outcome = (None, exc)
            with contextlib.suppress(RuntimeError):  # the loop closed while loading
                loop.call_soon_threadsafe(_settle, done, *outcome)

        threading.Thread(target=run, name="model-loader", daemon=True).start()
        try:
            model = await done
        except Exception:
            logger.exception("loading the model failed")
            self.fatal.set()
            return
        engine = AsyncEngine(model.core)
        engine.start()
        self.serving = self._make_serving(engine, model.tokenizer)
        self.engine = engine
        self._watch = asyncio.create_task(self._watch_engine(engine))
        logger.info("model loaded; engine running (%d KV blocks)", engine.stats().kv_blocks_total)

    async def _watch_engine(self, engine: AsyncEngine) -> None:
        await engine.crashed.wait()
        logger.error("the engine loop crashed; the server will exit")
        self.fatal.set()

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests, wait up to ``timeout_s`` seconds for those in flight,
        then end what is left."""
        self.in_flight.closed = True
        logger.info("draining: %d requests in flight", self.in_flight.count)
        try:
            await asyncio.wait_for(self.in_flight.wait_idle(), timeout_s)
            return
        except TimeoutError:
            pass
        logger.warning(
            "drain timeout of %.1f s reached; ending %d requests", timeout_s, self.in_flight.count
        )
        await self.end_requests(f"the server is shutting down (drain timeout of {timeout_s} s)")

    async def end_requests(self, reason: str, grace_s: float = ABORT_GRACE_S) -> None:
        """Refuse new requests and end every one in flight now with a 503 saying
        ``reason``, then wait up to ``grace_s`` seconds for their last bytes to go out.
        The engine keeps running (its lifespan shutdown stops it)."""
        self.in_flight.closed = True
        if self.in_flight.count == 0:
            return
        if self.engine is not None:
            self.engine.abort_all(EngineDeadError(reason))
        try:
            await asyncio.wait_for(self.in_flight.wait_idle(), grace_s)
        except TimeoutError:
            logger.warning("%d requests still open after ending them", self.in_flight.count)

    async def shutdown(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.engine is not None:
            await self.engine.shutdown()


def _settle(
    future: asyncio.Future[LoadedModel], value: LoadedModel | None, error: Exception | None
) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert value is not None
        future.set_result(value)
