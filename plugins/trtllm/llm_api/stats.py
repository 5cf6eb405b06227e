"""TensorRT-LLM's iteration statistics, read the one way its LLM API supports while the
adapter's event loop runs: ``async for`` over ``LLM.get_stats_async(timeout)`` on that
loop, with ``timeout > 0``.

Why (NVIDIA/TensorRT-LLM sources; tests/trtllm/fake_llmapi/_stats.py reproduces them):
the first ``generate_async`` makes the one statistics ``IterationResult``, and since the
adapter calls it on its loop, that result's queue is an ``AsyncQueue`` whose sync face
returns ``None`` at its deadline, so the sync ``LLM.get_stats`` raises ``TypeError``
from ``json.loads(None)`` (``tensorrt_llm/llmapi/utils.py`` ``_SyncQueue.get``,
``tensorrt_llm/executor/result.py`` ``IterationResult.get_results``) and taints the
queue for the async reader. ``timeout=0`` raises ``asyncio.QueueEmpty`` out of the
iteration, which only catches ``asyncio.TimeoutError``.

Two properties shape the reader:

- **The latch.** An iteration that waits ``timeout`` seconds for nothing sets the
  result's ``_done``; every later iteration ends at once until the next
  ``generate_async`` calls ``mark_undone()``. So the reader stops after each idle wait
  and starts again when ``rearm`` says a request was submitted.
- **The delay.** The worker's statistics thread queues entries 0.2 s after their
  iteration (``tensorrt_llm/executor/worker.py``), and the proxy of a multi-process LLM
  another 0.2 s later (``tensorrt_llm/executor/proxy.py``): a picture is about 0.2-0.4 s
  behind TensorRT-LLM when it arrives. ``READ_TIMEOUT_S`` is well above that, so the
  reader latches only when TensorRT-LLM has run no iteration for seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from plugins.trtllm.kv import KvSnapshot
from plugins.trtllm.llm_api.translate import kv_snapshot

# get_stats_async's wait for the next entry (TensorRT-LLM's own default is 2 s): longer
# than the delivery delay, so only an idle LLM latches the reader.
READ_TIMEOUT_S = 2.0


class LatestKv:
    """The newest KV picture read, shared between the loop (writer) and the engine's
    thread (reader). ``version`` counts the pictures read; ``error`` is set once the
    reader stopped on an error."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._snapshot: KvSnapshot | None = None
        self._version = 0
        self.error: str | None = None

    def put(self, snapshot: KvSnapshot) -> None:
        with self._cond:
            self._snapshot = snapshot
            self._version += 1
            self._cond.notify_all()

    def fail(self, error: str) -> None:
        with self._cond:
            self.error = error
            self._cond.notify_all()

    def newer_than(self, version: int) -> tuple[KvSnapshot, int] | None:
        """The newest picture and its version if it is newer than ``version``; never
        waits."""
        with self._cond:
            if self._snapshot is None or self._version <= version:
                return None
            return self._snapshot, self._version

    def wait_first(self, timeout_s: float) -> KvSnapshot | None:
        """Block up to ``timeout_s`` seconds for a first picture; ``None`` when none came
        (or the reader failed: see ``error``)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._snapshot is not None or self.error is not None, timeout_s
            )
            return self._snapshot


class KvStatsReader:
    """One task on the adapter's loop that reads every statistics entry TensorRT-LLM
    queues and keeps the newest KV picture in ``latest``. ``rearm`` is called on the
    loop after every ``generate_async`` (the first one starts the task)."""

    def __init__(self, llm: Any, read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self._llm = llm
        self._read_timeout_s = read_timeout_s
        self.latest = LatestKv()
        self._armed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def rearm(self) -> None:
        """On the loop, after a submission: TensorRT-LLM has lifted its latch."""
        if self._armed is None:
            self._armed = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(self._armed))
        self._armed.set()

    async def _run(self, armed: asyncio.Event) -> None:
        while True:
            await armed.wait()
            armed.clear()
            try:
                async for entry in self._llm.get_stats_async(timeout=self._read_timeout_s):
                    snapshot = kv_snapshot([entry], time.monotonic())
                    if snapshot is not None:
                        self.latest.put(snapshot)
            except Exception as err:  # the reader is gone; start-up reports it
                self.latest.fail(f"{type(err).__name__}: {err}")
                return
