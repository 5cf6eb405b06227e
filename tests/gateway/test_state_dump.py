"""The state dump: when the engine loop dies, the last plan and ``EngineCore.stats()``
are logged once, so a crash report carries what the scheduler was doing."""

from __future__ import annotations

import asyncio
import logging

import pytest

from orchestrator.common.async_engine import AsyncEngine
from orchestrator.core.errors import EngineDeadError
from tests.factories import make_engine, make_request, run_step
from tests.gateway.support import fake_core

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def test_the_dump_names_the_last_plan_and_the_stats_but_no_token_ids() -> None:
    engine, clock = make_engine(block_size=4)
    assert "no plan yet" in engine.dump_state()
    engine.scheduler.add_request(make_request(6, 3, request_id="r1", prompt=[901] * 6))
    run_step(engine, clock)
    dump = engine.dump_state()
    assert "r1: 6 tokens at 0, 2 blocks, samples" in dump
    assert "num_running=1" in dump and "num_waiting=0" in dump
    assert "901" not in dump  # users' text stays out of the log


async def test_a_crash_logs_the_engine_state_once(caplog: pytest.LogCaptureFixture) -> None:
    core, executor = fake_core()
    executor.crash_after(1)
    engine = AsyncEngine(core)
    engine.start()
    with caplog.at_level(logging.ERROR, logger="orchestrator.common.async_engine"):
        stream = await engine.submit(make_request(8, 5, request_id="victim"))
        with pytest.raises(EngineDeadError):
            async with stream:
                async for _ in stream:
                    pass
        await asyncio.wait_for(engine.crashed.wait(), 5)
    dumps = [r.getMessage() for r in caplog.records if "engine state" in r.getMessage()]
    assert len(dumps) == 1
    assert "victim: 1 tokens at 8" in dumps[0] and "num_running=1" in dumps[0]
    await engine.shutdown()
