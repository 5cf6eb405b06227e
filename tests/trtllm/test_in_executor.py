"""The in-executor scheduler on the fake PyExecutor loop (tests/trtllm/fake_pyexecutor.py):
the same decisions as EngineCore on the sim executor, the core's scheduling behaviours
inside the loop, KV agreement with TensorRT-LLM's allocation rule, pause and resume by
recompute, two tensor-parallel ranks, per-request facts, and the version gate."""

from __future__ import annotations

import abc
import os
import queue
import re
import threading
import types as pytypes
from collections import namedtuple
from typing import Any

import pytest

from orchestrator.core.clock import VirtualClock
from orchestrator.core.config import SchedulerConfig
from plugins.trtllm import names
from plugins.trtllm.errors import TrtllmError
from plugins.trtllm.in_executor import adapter as inst_adapter
from plugins.trtllm.in_executor import install as inst
from plugins.trtllm.in_executor.adapter import CoreRequestScheduler, KvSource, our_priority
from plugins.trtllm.in_executor.facts import FactsChannel, FactsSource, RequestFacts
from plugins.trtllm.in_executor.ranks import DistLink
from plugins.trtllm.in_executor.refusals import RefusalChannel
from plugins.trtllm.llm_api.translate import llm_priority
from tests.trtllm.fake_pyexecutor import (
    OUTPUT_TYPES,
    UTIL_MODULE,
    FakeDist,
    FakeGuidedDecoder,
    FakeKvCacheCreator,
    FakeKvCacheManager,
    FakeLlmRequest,
    FakePyExecutor,
    FakeSimpleScheduler,
    FakeWorkerExecutor,
    LlmRequestState,
    RequestScheduler,
    create_py_executor,
    position_sampler,
)
from tests.trtllm.in_executor_harness import (
    describe,
    loop_engine,
    run_engine_core,
    run_in_executor,
    seeded_workload,
    types,
)

BS = 16


def make_loop(
    num_blocks: int = 64, facts: FactsSource | None = None, line: str = "1.3", **config: Any
) -> tuple[FakePyExecutor, CoreRequestScheduler, VirtualClock]:
    trt_kv = FakeKvCacheManager(num_blocks, BS)
    clock = VirtualClock()
    adapter = CoreRequestScheduler(
        loop_engine(SchedulerConfig(**config), num_blocks, clock),
        types(line),
        KvSource(trt_kv),
        facts=facts,
        record=True,
    )

    def tick(out: Any) -> None:
        clock.advance_to(clock.now() + 0.01)

    def allocated() -> None:
        assert adapter.scheduler.kv.num_free_blocks == trt_kv.num_free

    loop = FakePyExecutor(
        adapter, trt_kv, position_sampler(1000), on_iteration=tick, on_allocated=allocated
    )
    return loop, adapter, clock


def submit(
    loop: FakePyExecutor, facts: FactsChannel, rid: int, prompt_len: int, max_tokens: int, **kw: Any
) -> None:
    with facts.submitting() as staged:
        loop.submit(
            FakeLlmRequest(rid, [(5 * i + rid) % 997 + 1 for i in range(prompt_len)], max_tokens)
        )
        staged[rid] = RequestFacts(**kw)


def run(loop: FakePyExecutor, max_iterations: int = 2000) -> list[Any]:
    outs = []
    while loop.has_work():
        outs.append(loop.iterate())
        assert len(outs) <= max_iterations, "loop did not drain"
    return outs


# ---------------------------------------------------------------- the done-when comparison


@pytest.mark.parametrize(
    ("seed", "config", "num_blocks"),
    [
        (1, {"policy": "priority", "max_num_tokens": 256, "chunk_size": 128}, 40),
        (2, {"policy": "fcfs", "max_num_tokens": 192, "chunk_size": 64, "max_batch_size": 6}, 26),
        (
            3,
            {"policy": "priority", "max_num_tokens": 160, "chunk_size": 96, "aging_rate": 20.0},
            26,
        ),
    ],
)
def test_same_decisions_as_engine_core_on_the_sim_executor(
    seed: int, config: dict[str, Any], num_blocks: int, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = seeded_workload(seed)
    # The in-loop core aligns chunks to TensorRT-LLM's KV block (in_loop_engine): the
    # engine it is compared with runs the same scheduler config.
    cfg = SchedulerConfig(**config, chunk_unit=BS)
    expected = run_engine_core(jobs, cfg, num_blocks)
    got = run_in_executor(jobs, cfg, num_blocks)
    with capsys.disabled():
        print(f"\nseed {seed}, {config}, {num_blocks} KV blocks: {len(got.records)} iterations")
        for i, record in enumerate(got.records[:12]):
            print(f"  {i:3d} {describe(record)}")
    assert got.records == expected
    # The workload exercised what it is meant to: chunks, preemption, every request done.
    assert any(n > 1 and start > 0 for r in got.records for _, start, n, _ in r[0])
    assert any(r[1] for r in got.records), "no preemption: make the KV pool smaller"
    assert sorted(got.loop.finished) == [j.request_id for j in jobs]
    for job in jobs:
        req = got.loop.finished[job.request_id]
        assert len(req.tokens) == len(job.prompt) + job.max_tokens
    assert got.kv_agreed, "the core's free blocks differed from TensorRT-LLM's"


def test_both_scheduler_output_shapes_carry_the_same_decisions() -> None:
    jobs = seeded_workload(4, n=10)
    cfg = SchedulerConfig(max_num_tokens=128, chunk_size=64)
    old = run_in_executor(jobs, cfg, 24, line="1.2")
    new = run_in_executor(jobs, cfg, 24, line="1.3")
    assert old.records == new.records
    assert old.adapter.history == new.adapter.history


# ---------------------------------------------------------------- core behaviours in the loop


def test_chunked_prefill_stays_under_the_token_budget_with_decodes_first() -> None:
    facts = FactsChannel()
    loop, adapter, _ = make_loop(facts=facts, max_num_tokens=64, chunk_size=48)
    submit(loop, facts, 1, 8, 20)
    loop.iterate()  # request 1 prefilled whole
    submit(loop, facts, 2, 200, 2)
    run(loop)
    for d in adapter.history:  # the chunk sizes set on the LlmRequests, per iteration
        assert sum(n for _, n in d.context) + len(d.generation) <= 64
    chunks = [n for d in adapter.history for rid, n in d.context if rid == 2]
    assert len(chunks) >= 4 and max(chunks) <= 48
    both = [d for d in adapter.history if 1 in d.generation and any(r == 2 for r, _ in d.context)]
    assert both, "request 1 kept decoding while request 2 prefilled"
    assert sum(chunks) == 200
    assert len(loop.finished[2].tokens) == 202


def test_chunks_are_whole_kv_blocks_but_a_prompts_last() -> None:
    """39 tokens of budget beside a decode: TensorRT-LLM's own scheduler would give the
    prompt 32 (a multiple of tokens_per_block, microBatchScheduler.cpp), so ours does."""
    facts = FactsChannel()
    loop, adapter, _ = make_loop(facts=facts, max_num_tokens=40, chunk_size=64, max_batch_size=8)
    submit(loop, facts, 1, 8, 30)
    loop.iterate()  # request 1 prefilled whole
    submit(loop, facts, 2, 100, 2)
    run(loop)
    chunks = [n for d in adapter.history for rid, n in d.context if rid == 2]
    assert chunks == [32, 32, 36]  # the last, 36 of the 39, ends the prompt
    assert loop.unaligned_chunks == []
    assert len(loop.finished[2].tokens) == 102


def test_the_fake_loop_records_a_chunk_tensorrt_llms_scheduler_would_not_make() -> None:
    class TenTokenChunks(FakeSimpleScheduler):
        def schedule_request(self, active_requests: list[FakeLlmRequest], inflight: Any) -> Any:
            out = super().schedule_request(active_requests, inflight)
            for req in out.context_requests:
                req.context_chunk_size = min(10, req.context_remaining_length)
            return out

    trt_kv = FakeKvCacheManager(8, BS)
    loop = FakePyExecutor(TenTokenChunks(OUTPUT_TYPES["1.3"]), trt_kv, position_sampler(1000))
    loop.submit(FakeLlmRequest(1, list(range(1, 41)), 1))
    run(loop)
    # Chunks at 0, 10 and 20 are not whole blocks of 16; the last (30-40) ends the prompt.
    assert loop.unaligned_chunks == [(1, 0, 10), (1, 10, 10), (1, 20, 10)]


def test_priority_overtakes_inside_the_loop() -> None:
    facts = FactsChannel()
    loop, adapter, _ = make_loop(facts=facts, policy="priority", max_batch_size=1)
    submit(loop, facts, 1, 8, 3, priority=0)
    loop.iterate()
    submit(loop, facts, 2, 8, 3, priority=5)
    submit(loop, facts, 3, 8, 3, priority=1)
    run(loop)
    first_scheduled = []
    for decision in adapter.history:
        for rid, _ in decision.context:
            if rid not in first_scheduled:
                first_scheduled.append(rid)
    assert first_scheduled == [1, 3, 2]


def test_kv_pressure_pauses_in_tensorrt_llm_and_the_request_resumes_by_recompute() -> None:
    facts = FactsChannel()
    loop, adapter, _ = make_loop(num_blocks=6, facts=facts, policy="priority")
    submit(loop, facts, 1, 30, 40, priority=2)  # 2 blocks, grows to 5
    submit(loop, facts, 2, 30, 40, priority=0)
    outs = run(loop)
    paused = [r.py_request_id for out in outs for r in out.paused_requests]
    assert paused and set(paused) == {1}, "the worse priority yields its blocks"
    victim = loop.finished[1]
    # Paused, it came back as a context request over prompt + output, then finished.
    assert victim.prompt_len > 30
    assert len(victim.tokens) == 30 + 40 and len(loop.finished[2].tokens) == 70
    assert adapter.scheduler.num_preemptions == len(paused)


def _guided_loop(num_blocks: int) -> tuple[FakePyExecutor, tuple[int, ...]]:
    """Request 1 (30 prompt tokens, 40 out, priority 2) constrained to a literal grammar
    of 40 tokens and request 2 (priority 0) beside it, run to the end under TensorRT-LLM's
    guided decoder (the fake) with ``num_blocks`` KV blocks of 16."""
    facts = FactsChannel()
    loop, _, _ = make_loop(num_blocks=num_blocks, facts=facts, policy="priority")
    loop.guided = FakeGuidedDecoder()
    grammar = tuple(range(500, 540))
    with facts.submitting() as staged:
        constrained = FakeLlmRequest(1, list(range(1, 31)), 40)
        constrained.guided_decoding_params = grammar  # type: ignore[attr-defined]
        loop.submit(constrained)
        staged[1] = RequestFacts(priority=2)
    submit(loop, facts, 2, 30, 40, priority=0)
    run(loop)
    return loop, grammar


def test_a_constrained_request_follows_its_grammar_while_never_paused() -> None:
    loop, grammar = _guided_loop(num_blocks=64)
    assert loop.finished[1].prompt_len == 30
    assert loop.finished[1].tokens[30:] == list(grammar)


def test_a_constrained_request_paused_in_the_loop_restarts_its_grammar() -> None:
    """Why ``scheduling: in_executor`` refuses ``guided_decoding_backend``
    (``llm_api.settings.with_scheduling``; ``test_in_executor_mode.py`` checks the
    refusal): after a pause the request is a context request again, and TensorRT-LLM's
    guided decoder gives it a fresh matcher at its last context chunk."""
    loop, grammar = _guided_loop(num_blocks=6)
    victim = loop.finished[1]
    k = victim.prompt_len - 30  # output tokens the pause moved into the prompt
    assert 0 < k < 40, "request 1 was paused part-way through its output"
    output = victim.tokens[30:]
    assert output[:k] == list(grammar[:k])
    assert output[k:] == list(grammar[: 40 - k]), "the grammar started again"
    assert output != list(grammar)


def test_aging_bounds_a_low_priority_wait_inside_the_loop() -> None:
    facts = FactsChannel()
    loop, adapter, _ = make_loop(facts=facts, policy="priority", aging_rate=50.0, max_batch_size=1)
    submit(loop, facts, 100, 8, 2, priority=3)
    for i in range(40):
        submit(loop, facts, i + 1, 8, 2, priority=0)
        loop.iterate()
    started = [rid for d in adapter.history for rid, _ in d.context]
    assert 100 in started, "aging let the low-priority request in under a steady high stream"
    assert started.index(100) < 30


def test_a_request_cancelled_in_tensorrt_llm_leaves_the_core() -> None:
    facts = FactsChannel()
    loop, adapter, _ = make_loop(facts=facts)
    submit(loop, facts, 1, 40, 30)
    submit(loop, facts, 2, 8, 3)
    loop.iterate()
    loop.iterate()
    loop.cancel(1)
    run(loop)
    loop.iterate()  # the idle iteration after the last: the core learns of the end
    assert not adapter.scheduler.requests
    assert adapter.scheduler.kv.num_free_blocks == 64
    assert len(loop.finished[2].tokens) == 11


def refusing_loop(
    num_blocks: int = 16,
) -> tuple[FakePyExecutor, CoreRequestScheduler, FactsChannel, list[tuple[int, str]]]:
    """A loop whose adapter reports refusals; the listener plays the submitting side
    (llm_api.backend): it records the refusal and aborts the request in TensorRT-LLM."""
    facts, refusals = FactsChannel(), RefusalChannel()
    trt_kv = FakeKvCacheManager(num_blocks, BS)
    adapter = CoreRequestScheduler(
        loop_engine(SchedulerConfig(), num_blocks, VirtualClock()),
        types(),
        KvSource(trt_kv),
        facts=facts,
        refusals=refusals,
        record=True,
    )
    loop = FakePyExecutor(adapter, trt_kv, position_sampler(1000))
    heard: list[tuple[int, str]] = []

    def front(request_id: int, reason: str) -> None:
        heard.append((request_id, reason))
        loop.cancel(request_id)  # RequestOutput.abort() -> PyExecutor.cancel_request

    refusals.listen(front)
    return loop, adapter, facts, heard


def test_a_refused_request_ends_with_its_error_and_the_others_carry_on() -> None:
    runs = []
    for with_bad in (False, True):
        loop, adapter, facts, heard = refusing_loop()
        submit(loop, facts, 1, 40, 30)
        if with_bad:
            # 20 + 300 tokens need 20 blocks of 16; the pool holds 16: the core refuses it.
            submit(loop, facts, 2, 20, 300)
        submit(loop, facts, 3, 24, 12)
        run(loop)
        loop.iterate()  # the idle iteration after the last: the core learns of the end
        runs.append((loop, adapter, heard))
    (clean, clean_adapter, _), (loop, adapter, heard) = runs
    assert [rid for rid, _ in heard] == [2]
    assert re.search(
        r"refused the request: .*needs 20 KV blocks; the KV pool holds 16", heard[0][1]
    )
    bad = loop.finished[2]
    assert bad.state == LlmRequestState.GENERATION_COMPLETE and bad.num_generated == 0
    scheduled = {r for d in adapter.history for r, _ in d.context} | {
        r for d in adapter.history for r in d.generation
    }
    assert scheduled == {1, 3}, "the refused request was never scheduled"
    assert not adapter.refused, "forgotten once TensorRT-LLM dropped it"
    assert not adapter.scheduler.requests and adapter.scheduler.kv.num_free_blocks == 16
    assert loop.kv.num_free == 16
    for rid in (1, 3):
        assert loop.finished[rid].tokens == clean.finished[rid].tokens
    assert adapter.history == clean_adapter.history, "the others' schedule is unchanged"


def test_a_refusal_nobody_hears_leaves_the_request_unscheduled_and_the_loop_running() -> None:
    facts = FactsChannel()
    loop, adapter, _ = make_loop(num_blocks=16, facts=facts)  # no refusal channel
    submit(loop, facts, 2, 20, 300)
    submit(loop, facts, 3, 24, 12)
    for _ in range(20):
        loop.iterate()
    assert 3 in loop.finished and len(loop.finished[3].tokens) == 36
    assert list(adapter.refused) == [2]
    assert re.search(r"needs 20 KV blocks; the KV pool holds 16", adapter.refused[2])
    assert [r.py_request_id for r in loop.active_requests] == [2]
    assert loop.kv.num_free == 16, "a refused request holds no KV"


def test_the_refusal_channel_reports_whether_it_was_heard_and_never_raises() -> None:
    channel = RefusalChannel()
    assert channel.refuse(4, "no") is False, "nobody listens yet"
    heard: list[tuple[int, str]] = []
    channel.listen(lambda rid, why: heard.append((rid, why)))
    assert channel.refuse(5, "too long") is True and heard == [(5, "too long")]

    def closed(rid: int, why: str) -> None:
        raise RuntimeError("Event loop is closed")

    channel.listen(closed)
    assert channel.refuse(6, "x") is False  # logged; TensorRT-LLM's loop carries on


# ---------------------------------------------------------------- tensor parallel


def test_two_ranks_follow_rank_zero() -> None:
    dist = FakeDist()
    loops, adapters = [], []
    for rank in (0, 1):
        trt_kv = FakeKvCacheManager(12, BS)
        clock = VirtualClock()
        adapter = CoreRequestScheduler(
            loop_engine(
                SchedulerConfig(policy="priority", max_num_tokens=96, chunk_size=48), 12, clock
            ),
            types(),
            KvSource(trt_kv),
            link=DistLink(dist, rank),
            record=rank == 0,
        )
        adapters.append(adapter)
        loops.append(FakePyExecutor(adapter, trt_kv, position_sampler(1000)))
    for rid, (n, out, prio) in enumerate([(60, 30, 1), (100, 20, 0), (20, 50, 2)], start=1):
        for loop in loops:
            req = FakeLlmRequest(rid, list(range(1, n + 1)), out)
            req.priority = llm_priority(prio)  # type: ignore[attr-defined]
            loop.submit(req)
    steps = 0
    while loops[0].has_work():
        outs = [loop.iterate() for loop in loops]  # rank 0 first, as the broadcast needs
        ids = [
            (
                [(r.py_request_id, r.context_chunk_size) for r in o.context_requests],
                [r.py_request_id for r in o.generation_requests],
                [r.py_request_id for r in o.paused_requests],
            )
            for o in outs
        ]
        assert ids[0] == ids[1]
        assert loops[0].kv.blocks == loops[1].kv.blocks
        steps += 1
        assert steps < 1000
    assert not loops[1].has_work()
    assert {r: q.tokens for r, q in loops[0].finished.items()} == {
        r: q.tokens for r, q in loops[1].finished.items()
    }
    assert not adapters[1].scheduler.requests, "a follower runs no core of its own"
    assert any(d.paused for d in adapters[0].history)


# ---------------------------------------------------------------- facts and priorities


def test_facts_reach_the_core_and_the_release_priority_is_the_fallback() -> None:
    facts = FactsChannel()
    loop, adapter, _ = make_loop(
        facts=facts,
        slo_classes={"chat": {"ttft_ms": 500, "tpot_ms": 80}},
    )
    submit(loop, facts, 1, 8, 4, priority=2, slo_class="chat", tenant="acme", arrival_time=0.0)
    req = FakeLlmRequest(2, list(range(1, 9)), 4)
    req.priority = llm_priority(-3)  # type: ignore[attr-defined]
    loop.submit(req)
    loop.iterate()
    core = adapter.scheduler.requests
    assert (core["1"].priority, core["1"].slo_class, core["1"].tenant) == (2, "chat", "acme")
    assert core["2"].priority == -3 and core["2"].slo_class is None
    assert len(facts) == 0
    assert [our_priority(llm_priority(p)) for p in (-7, 0, 4)] == [-7, 0, 4]


def test_facts_are_not_read_while_a_submission_holds_the_channel() -> None:
    import threading

    facts = FactsChannel()
    seen: list[RequestFacts | None] = []
    with facts.submitting() as staged:
        reader = threading.Thread(target=lambda: seen.append(facts.take(7)))
        reader.start()
        reader.join(0.05)
        assert reader.is_alive(), "take waited for the submission"
        staged[7] = RequestFacts(priority=1)
    reader.join(5)
    assert seen == [RequestFacts(priority=1)]


# ---------------------------------------------------------------- version gate and install


@pytest.mark.parametrize("version", ["1.2.1", "1.2.0", "1.3.0rc5", "1.3.0rc27", "1.3.1"])
def test_checked_releases_pass_the_gate(version: str) -> None:
    assert inst.release_line(version) in ("1.2", "1.3")


@pytest.mark.parametrize("version", ["1.4.0rc4", "1.1.0", "0.21.0", "dev"])
def test_other_releases_are_refused_naming_the_checked_range(version: str) -> None:
    with pytest.raises(TrtllmError, match=r"1\.2\.x and 1\.3\.x") as err:
        inst.release_line(version)
    assert version in str(err.value) and "executor.scheduling" in str(err.value)


# A shape no release is known to have: one more field than 1.3's seven, with a default.
DEFAULTED_EXTRA = namedtuple(
    "SchedulerOutput",
    [*OUTPUT_TYPES["1.3"]._fields, "a_later_field"],
    defaults=[None, "default"],
)
SCHEDULER = pytypes.SimpleNamespace(schedule_request=print)


@pytest.mark.parametrize("shape", ["1.2", "1.3", "1.3@5f480b7a"])
def test_every_scheduler_output_shape_read_passes_the_gate(shape: str) -> None:
    inst.check_interface(shape[:3], OUTPUT_TYPES[shape], SCHEDULER)


def test_an_output_with_a_further_defaulted_field_passes_and_keeps_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inst.check_interface("1.3", DEFAULTED_EXTRA, SCHEDULER)
    monkeypatch.setitem(OUTPUT_TYPES, "extra", DEFAULTED_EXTRA)
    facts = FactsChannel()
    loop, _, _ = make_loop(facts=facts, line="extra")
    submit(loop, facts, 1, 20, 3)
    outs = run(loop)
    assert all(o.a_later_field == "default" for o in outs)
    assert len(loop.finished[1].tokens) == 23


def test_an_interface_the_adapter_cannot_fill_is_refused() -> None:
    missing = namedtuple("SchedulerOutput", ["context_requests", "generation_requests"])
    with pytest.raises(TrtllmError, match=r"lacks \['paused_requests'"):
        inst.check_interface("1.3", missing, SCHEDULER)
    required = namedtuple("SchedulerOutput", [*OUTPUT_TYPES["1.2"]._fields, "new_field"])
    with pytest.raises(TrtllmError, match=r"has \['new_field'\] with no default"):
        inst.check_interface("1.3", required, SCHEDULER)
    with pytest.raises(TrtllmError, match="schedule_request is missing"):
        inst.check_interface("1.3", OUTPUT_TYPES["1.3"], object())


def fake_release_modules(version: str) -> dict[str, Any]:
    """Module stand-ins with the names load_release (and, on more than one rank,
    workers.reach_workers) reads, shaped as the sources: the creator builds
    ``FakeWorkerExecutor``s (8 blocks of 16 unless told) with TensorRT-LLM's own
    scheduler, and ``_util`` holds a ``KvCacheCreator`` class of this release's own (the
    installer wraps one of its methods)."""
    output_type = OUTPUT_TYPES["1.2" if version.startswith("1.2") else "1.3"]

    def create_py_executor_instance(
        tp_size: int = 1, rank: int = 0, num_blocks: int = 8, tokens_per_block: int = BS
    ) -> FakeWorkerExecutor:
        dist = pytypes.SimpleNamespace(
            tp_size=tp_size, pp_size=1, rank=rank, broadcast=FakeDist().broadcast
        )
        return FakeWorkerExecutor(
            FakeKvCacheManager(num_blocks, tokens_per_block), output_type, dist
        )

    class KvCacheCreator(FakeKvCacheCreator):
        """This release's class (the installer wraps its method)."""

    def worker_main(**kwargs: Any) -> None:  # replaced by each test that reaches workers
        raise AssertionError("no worker in this test")

    return {
        "tensorrt_llm": pytypes.SimpleNamespace(__version__=version),
        inst.SCHEDULER_MODULE: pytypes.SimpleNamespace(
            SchedulerOutput=output_type,
            RequestScheduler=RequestScheduler,
        ),
        inst.LLM_REQUEST_MODULE: pytypes.SimpleNamespace(LlmRequestState=LlmRequestState),
        inst.RESOURCE_MANAGER_MODULE: pytypes.SimpleNamespace(
            ResourceManagerType=pytypes.SimpleNamespace(KV_CACHE_MANAGER="KV"),
            KVCacheManager=FakeKvCacheManager,
        ),
        inst.CREATOR_MODULE: pytypes.SimpleNamespace(
            create_py_executor_instance=create_py_executor_instance
        ),
        UTIL_MODULE: pytypes.SimpleNamespace(KvCacheCreator=KvCacheCreator),
        names.IN_EXECUTOR_PROXY_MODULE: pytypes.SimpleNamespace(worker_main=worker_main),
        names.IN_EXECUTOR_WORKER_MODULE: pytypes.SimpleNamespace(worker_main=worker_main),
    }


def test_an_executor_on_the_v2_kv_cache_manager_is_refused() -> None:
    release = inst.load_release(fake_release_modules("1.3.0rc27").__getitem__)

    class KVCacheManagerV2:  # resource_manager.py: a BaseResourceManager, not a KVCacheManager
        def get_kv_cache_stats(self) -> None: ...

    managers: dict[str, Any] = {"KV": KVCacheManagerV2()}
    executor = pytypes.SimpleNamespace(
        resource_manager=pytypes.SimpleNamespace(resource_managers=managers)
    )
    with pytest.raises(TrtllmError, match=r"V1 KV cache manager.*runs KVCacheManagerV2"):
        inst.kv_cache_manager(executor, release)
    managers["KV"] = v1 = FakeKvCacheManager(8, BS)
    assert inst.kv_cache_manager(executor, release) is v1


def test_install_puts_our_scheduler_on_every_executor_built_and_undo_restores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(inst.SINGLE_PROCESS_ENV, raising=False)
    modules = fake_release_modules("1.3.0rc27")
    release = inst.load_release(modules.__getitem__)
    assert release.line == "1.3" and release.types.context_init is LlmRequestState.CONTEXT_INIT

    def factory(py_executor: Any, rel: Any) -> Any:
        kv = inst.kv_cache_manager(py_executor, rel)
        return CoreRequestScheduler(
            loop_engine(SchedulerConfig(), kv.num_blocks, VirtualClock()), rel.types, KvSource(kv)
        )

    undo = inst.install(release, factory)
    assert os.environ[inst.SINGLE_PROCESS_ENV] == "1"
    built = modules[inst.CREATOR_MODULE].create_py_executor_instance()
    assert isinstance(built.scheduler, CoreRequestScheduler)
    with pytest.raises(TrtllmError, match="already installed"):
        inst.install(release, factory)
    undo()
    own = modules[inst.CREATOR_MODULE].create_py_executor_instance().scheduler
    assert isinstance(own, FakeSimpleScheduler)
    assert inst.SINGLE_PROCESS_ENV not in os.environ


def test_load_release_refuses_an_unchecked_release_before_touching_anything() -> None:
    modules = fake_release_modules("1.4.0rc4")
    with pytest.raises(TrtllmError, match=r"checked against TensorRT-LLM 1\.2\.x and 1\.3\.x"):
        inst.load_release(modules.__getitem__)


@pytest.mark.parametrize(
    ("dist", "executor", "match"),
    [
        ({"tp_size": 1, "pp_size": 2}, {}, "one pipeline-parallel rank .*pp_size 2"),
        ({"tp_size": 2, "pp_size": 2}, {}, "one pipeline-parallel rank"),
        ({"tp_size": 2, "pp_size": 1, "cp_size": 2}, {}, "one context-parallel rank"),
        ({"tp_size": 2, "pp_size": 1}, {"enable_attention_dp": True}, "attention data par"),
        ({"tp_size": 1, "pp_size": 1}, {"disable_overlap_scheduler": False}, "overlap sched"),
        ({"tp_size": 1, "pp_size": 1}, {"enable_batch_waiting": True}, "batch waiting"),
    ],
)
def test_an_executor_the_adapter_cannot_schedule_is_refused_at_start(
    dist: dict[str, int], executor: dict[str, bool], match: str
) -> None:
    py_executor = pytypes.SimpleNamespace(
        dist=pytypes.SimpleNamespace(**dist),
        **{"disable_overlap_scheduler": True, "enable_attention_dp": False, **executor},
    )
    with pytest.raises(TrtllmError, match=match):
        inst.check_executor(py_executor)


@pytest.mark.parametrize("tp_size", [1, 2, 8])
def test_tensor_parallel_executors_are_accepted(tp_size: int) -> None:
    py_executor = pytypes.SimpleNamespace(
        dist=pytypes.SimpleNamespace(tp_size=tp_size, pp_size=1, cp_size=1),
        disable_overlap_scheduler=True,
        enable_attention_dp=False,
    )
    inst.check_executor(py_executor)  # raises nothing


# ---------------------------------------------------------------- check_names, in-executor mode


def private_modules(version: str, **replaced: Any) -> dict[str, Any]:
    """Stand-ins for the private modules with the names check_names looks for."""

    class RequestScheduler:
        def schedule_request(self) -> None: ...

        def can_schedule(self) -> None: ...

    class LlmRequest:
        state = get_tokens = get_last_tokens = get_num_tokens = max_new_tokens = None
        context_current_position = context_chunk_size = None

    class PyExecutor:
        scheduler: Any

        def _schedule(self) -> None:
            self.scheduler.schedule_request([], set())

        def _pause_requests(self) -> None: ...

    class KVCacheManager:
        def get_kv_cache_stats(self) -> None: ...

    class TorchLlmArgs:
        disable_overlap_scheduler = False

    class Distributed:  # communicator.py at a1cf28f9: properties over its Mapping
        rank = tp_size = pp_size = cp_size = property(lambda self: 0)

        def broadcast(self, obj: Any, root: int = 0) -> Any: ...

    def worker_main(**kwargs: Any) -> None: ...

    modules: dict[str, Any] = {
        "tensorrt_llm": pytypes.SimpleNamespace(__version__=version),
        names.IN_EXECUTOR_SCHEDULER_MODULE: pytypes.SimpleNamespace(
            SchedulerOutput=OUTPUT_TYPES["1.2"], RequestScheduler=RequestScheduler
        ),
        names.IN_EXECUTOR_LLM_REQUEST_MODULE: pytypes.SimpleNamespace(
            LlmRequestState=LlmRequestState, LlmRequest=LlmRequest
        ),
        names.IN_EXECUTOR_CREATOR_MODULE: pytypes.SimpleNamespace(
            create_py_executor_instance=print
        ),
        names.IN_EXECUTOR_UTIL_MODULE: pytypes.SimpleNamespace(KvCacheCreator=FakeKvCacheCreator),
        names.IN_EXECUTOR_PY_EXECUTOR_MODULE: pytypes.SimpleNamespace(PyExecutor=PyExecutor),
        names.IN_EXECUTOR_RESOURCE_MANAGER_MODULE: pytypes.SimpleNamespace(
            KVCacheManager=KVCacheManager
        ),
        names.LLM_API_MODULE: pytypes.SimpleNamespace(TorchLlmArgs=TorchLlmArgs),
        names.IN_EXECUTOR_PROXY_MODULE: pytypes.SimpleNamespace(worker_main=worker_main),
        names.IN_EXECUTOR_WORKER_MODULE: pytypes.SimpleNamespace(worker_main=worker_main),
        names.IN_EXECUTOR_DISTRIBUTED_MODULE: pytypes.SimpleNamespace(Distributed=Distributed),
    }
    modules.update(replaced)
    return modules


def check(modules: dict[str, Any]) -> tuple[int, str]:
    import io

    from plugins.trtllm import check_names

    def import_module(name: str) -> Any:
        if modules.get(name) is None:
            raise ImportError(f"No module named {name!r}")
        return modules[name]

    out = io.StringIO()
    status = check_names.main(["--mode", "in-executor"], import_module=import_module, out=out)
    return status, out.getvalue()


def test_check_names_in_executor_mode_passes_on_the_names_read() -> None:
    from plugins.trtllm.names import IN_EXECUTOR_NAMES

    status, text = check(private_modules("1.2.1"))
    assert status == 0, text
    expected = 1 + sum(len(e.names) + (1 if e.owner else 0) for e in IN_EXECUTOR_NAMES) + 2
    assert sum(line.startswith("OK ") for line in text.splitlines()) == expected
    assert "py_request_id, py_client_id" in text
    assert "OK " in text and "PyExecutor calls self.scheduler.schedule_request" in text


def test_check_names_in_executor_mode_reports_an_unchecked_release_and_a_missing_name() -> None:
    status, text = check(private_modules("1.4.0rc4"))
    assert status == 1 and "1.2.x and 1.3.x" in text
    # A 1.3 build with the five-field tuple (scheduler/scheduler.py at 5f480b7a) passes.
    assert check(private_modules("1.3.0rc27"))[0] == 0
    scheduler_module = pytypes.SimpleNamespace(
        SchedulerOutput=namedtuple("SchedulerOutput", ["context_requests"]),
        RequestScheduler=FakeSimpleScheduler,
    )
    status, text = check(
        private_modules("1.3.0rc27", **{names.IN_EXECUTOR_SCHEDULER_MODULE: scheduler_module})
    )
    assert status == 1 and "lacks ['generation_requests'" in text
    modules = private_modules(
        "1.2.1",
        **{names.IN_EXECUTOR_CREATOR_MODULE: pytypes.SimpleNamespace()},
    )
    status, text = check(modules)
    assert status == 1 and "has no create_py_executor_instance" in text


def test_the_slo_budget_shrinks_chunks_inside_the_loop() -> None:
    """With a request of a 30 ms TPOT class running and steps known to cost 10 ms plus
    0.1 ms per token, a prefill beside it gets at most the tokens that keep the step
    within 30 ms (about 200), not the 1024 the token budget allows."""
    from orchestrator.core.predictor import ModelStepTimePredictor

    trt_kv = FakeKvCacheManager(256, BS)
    clock = VirtualClock()
    config = SchedulerConfig(
        max_num_tokens=1024,
        chunk_size=1024,
        slo_classes={"chat": {"ttft_ms": 5000, "tpot_ms": 30}},
        slo_budget={"enabled": True},
    )
    predictor = ModelStepTimePredictor(lambda f: 0.010 + 0.0001 * f.num_tokens)
    facts = FactsChannel()
    adapter = CoreRequestScheduler(
        loop_engine(config, 256, clock, predictor),
        types(),
        KvSource(trt_kv),
        facts=facts,
        record=True,
    )
    loop = FakePyExecutor(adapter, trt_kv, position_sampler(1000))
    submit(loop, facts, 1, 8, 30, slo_class="chat", arrival_time=0.0)
    loop.iterate()
    submit(loop, facts, 2, 1000, 2, slo_class="chat", arrival_time=0.0)
    run(loop)
    chunks = [n for d in adapter.history for rid, n in d.context if rid == 2]
    assert sum(chunks) == 1000 and len(chunks) >= 4
    assert max(chunks) <= 200, chunks


# ---------------------------------------------------------------- facts from another process


class LateFacts:
    """A facts source whose facts travel apart from the requests (``WorkerLink``'s
    contract): ``facts_wait_s`` of holding, facts that arrive when ``deliver`` is
    called."""

    def __init__(self, wait_s: float) -> None:
        self.facts_wait_s = wait_s
        self._facts: dict[int, RequestFacts] = {}
        self._arrived = threading.Event()

    def deliver(self, request_id: int, facts: RequestFacts) -> None:
        self._facts[request_id] = facts
        self._arrived.set()

    def wait_for_facts(self, timeout_s: float) -> bool:
        arrived = self._arrived.wait(timeout_s)
        self._arrived.clear()
        return arrived

    def take(self, request_id: int) -> RequestFacts | None:
        return self._facts.pop(request_id, None)


def test_a_request_is_held_until_its_facts_arrive_or_the_bound_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    facts = LateFacts(wait_s=0.5)
    trt_kv = FakeKvCacheManager(32, BS)
    clock = VirtualClock()
    adapter = CoreRequestScheduler(
        loop_engine(SchedulerConfig(policy="priority"), 32, clock),
        types(),
        KvSource(trt_kv),
        facts=facts,
        record=True,
    )
    loop = FakePyExecutor(adapter, trt_kv, position_sampler(1000))
    loop.submit(FakeLlmRequest(1, list(range(1, 20)), 4))  # its facts come at 0.3 s
    loop.submit(FakeLlmRequest(2, list(range(1, 20)), 4))  # no facts ever
    scheduled_at: dict[int, float] = {}
    arrivals: dict[str, float] = {}
    for _ in range(100):
        if clock.now() >= 0.3 and 1 not in scheduled_at:
            facts.deliver(1, RequestFacts(priority=-4, tenant="late"))
        out = loop.iterate()
        for r in [*out.context_requests, *out.generation_requests]:
            scheduled_at.setdefault(r.py_request_id, clock.now())
        for rid, request in adapter.scheduler.requests.items():
            arrivals.setdefault(rid, request.arrival_time)
        if clock.now() < 0.3:
            assert not adapter.scheduler.requests, "held: not in the core"
            assert trt_kv.num_free == 32, "held: no KV"
        clock.advance_to(clock.now() + 0.1)
        if not loop.has_work():
            break
    assert 0.3 <= scheduled_at[1] < 0.5, "scheduled once its facts came"
    assert scheduled_at[2] >= 0.5, "admitted with the defaults after the bound"
    assert arrivals["2"] == 0.0, "its TTFT counts from when the loop first saw it"
    assert adapter.num_without_facts == 1 and not adapter.awaiting_facts
    assert sorted(loop.finished) == [1, 2]
    assert "no facts for request 2 after 0.50 s" in caplog.text


def test_a_held_request_cancelled_before_its_facts_is_forgotten() -> None:
    facts = LateFacts(wait_s=10.0)
    loop, adapter, _ = make_loop(facts=facts)
    loop.submit(FakeLlmRequest(5, list(range(1, 10)), 3))
    loop.submit(FakeLlmRequest(6, list(range(1, 10)), 3))
    facts.deliver(6, RequestFacts())
    loop.iterate()
    assert list(adapter.awaiting_facts) == [5]
    loop.cancel(5)
    run(loop)
    loop.iterate()  # the idle iteration after the last: the adapter learns of the end
    assert not adapter.awaiting_facts and 5 in loop.finished and 6 in loop.finished
    assert loop.finished[5].num_generated == 0


# ---------------------------------------------------------------- idle iterations


class CountingFacts(FactsChannel):
    """A ``FactsChannel`` that records the adapter's idle waits (their bounds, seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait_for_facts(self, timeout_s: float) -> bool:
        self.waits.append(timeout_s)
        return super().wait_for_facts(timeout_s)


def test_with_only_a_refused_request_active_the_adapter_waits_instead_of_spinning() -> None:
    # TensorRT-LLM's fetch does not block while active_requests is non-empty
    # (_fetch_new_requests: timeout 0), so without this every empty iteration would
    # return at once and the loop would spin.
    facts = CountingFacts()
    loop, adapter, _ = make_loop(num_blocks=16, facts=facts)  # no refusal listener
    submit(loop, facts, 2, 20, 300)  # refused: needs 20 blocks of 16
    submit(loop, facts, 3, 24, 12)
    while 3 not in loop.finished:
        loop.iterate()
    assert facts.waits == [], "no idle wait while a batch runs"
    observed = 0
    for _ in range(3):
        out = loop.iterate()  # the first applies the last batch: observed
        assert not out.context_requests and not out.generation_requests
        observed = observed or adapter.engine.step_time_errors.count
    assert facts.waits == [inst_adapter.IDLE_WAIT_S] * 3, "each empty iteration waits"
    assert adapter.engine.step_time_errors.count == observed, "empty steps not observed"
    submit(loop, facts, 4, 8, 2)  # a submission: runs at once
    out = loop.iterate()
    assert [r.py_request_id for r in out.context_requests] == [4]


def test_a_submission_ends_the_idle_wait_at_once() -> None:
    facts = FactsChannel()
    assert facts.wait_for_facts(0.0) is False
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(facts.wait_for_facts(60.0)))
    waiter.start()
    with facts.submitting() as staged:
        staged[9] = RequestFacts()
    waiter.join(60.0)
    assert woke == [True], "woken by the submission, not the bound"


def test_a_cancelled_request_alone_ends_at_the_next_iteration_that_runs_a_batch() -> None:
    # The fake follows py_executor.py (9521caf4 and the _prepare_and_schedule_batch
    # copies): cancellations are handled only after a batch ran.
    facts = FactsChannel()
    loop, adapter, _ = make_loop(num_blocks=16, facts=facts)
    submit(loop, facts, 2, 20, 300)  # refused, never scheduled
    submit(loop, facts, 3, 24, 2)
    while 3 not in loop.finished:
        loop.iterate()
    loop.cancel(2)
    loop.iterate()
    assert [r.py_request_id for r in loop.active_requests] == [2], "no batch: still there"
    submit(loop, facts, 4, 8, 3)
    loop.iterate()
    assert 2 in loop.finished and loop.finished[2].num_generated == 0
    loop.iterate()
    assert not adapter.refused, "forgotten once TensorRT-LLM dropped it"


# ---------------------------------------------------------------- start-up: KV estimation


def test_the_kv_estimation_pass_runs_on_tensorrt_llms_scheduler_and_the_llm_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/trtllm.md's in-executor shape: no max_seq_len for TensorRT-LLM (its dummy
    prompts then take the model's own, 4096) and model.max_model_len 512 below
    max_num_tokens: our core would refuse the 1024-token dummies, nobody hears it, and
    configure_kv_cache_capacity's await (no timeout) would never return."""
    from orchestrator.core.config import EngineConfig
    from plugins.trtllm.in_executor.settings import InExecutorCore
    from plugins.trtllm.in_executor.start import start

    monkeypatch.delenv(inst.SINGLE_PROCESS_ENV, raising=False)
    modules = fake_release_modules("1.3.0rc27")
    engine = EngineConfig.model_validate(
        {
            "model": {"max_model_len": 512},
            "cache": {"block_size": BS},
            "executor": {"type": "sim", "model": "smollm2-135m", "hardware": "l40s"},
        }
    )
    mode = start(InExecutorCore(engine, 512), BS, modules.__getitem__)
    built: list[Any] = []
    creating = threading.Thread(
        target=lambda: built.append(
            create_py_executor(
                modules.__getitem__,
                max_num_tokens=1024,
                max_seq_len=None,
                model_max_seq_len=4096,
                num_blocks=64,
                tokens_per_block=BS,
            )
        ),
        daemon=True,  # left hanging if the estimation never ends
    )
    try:
        creating.start()
        creating.join(30.0)
        assert built, "LLM() never returned: the estimation's dummy requests never ended"
        (serving,) = built
        assert isinstance(serving.scheduler, CoreRequestScheduler), "ours runs the serving loop"
        assert serving.scheduler is mode.schedulers[-1]
        mode.check_started()
        facts = mode.facts
        assert isinstance(facts, FactsChannel)
        with facts.submitting() as staged:
            (rid,) = serving.enqueue_requests([list(range(1, 40))], max_tokens=3)
            staged[rid] = RequestFacts(priority=1)
        serving.await_responses([rid])
        assert serving.finished[rid].num_generated == 3
    finally:
        if built:
            built[0].shutdown()
        mode.shutdown()


# ---------------------------------------------------------------- requests the core ends


def test_a_request_the_core_sheds_is_ended_in_tensorrt_llm_through_the_refusal_path() -> None:
    """The core sheds a waiting request past its TTFT deadline (an error output of its
    own); TensorRT-LLM still holds it, unscheduled, so its client would wait for ever:
    the refusal listener hears it with the core's reason and aborts it there."""
    facts, refusals = FactsChannel(), RefusalChannel()
    trt_kv = FakeKvCacheManager(64, BS)
    clock = VirtualClock()
    config = SchedulerConfig(
        max_batch_size=1,
        slo_classes={"chat": {"ttft_ms": 50, "tpot_ms": 1000}},
        admission={"shed_after_deadline_s": 0.0},
    )
    adapter = CoreRequestScheduler(
        loop_engine(config, 64, clock),
        types(),
        KvSource(trt_kv),
        facts=facts,
        refusals=refusals,
    )
    loop = FakePyExecutor(
        adapter,
        trt_kv,
        position_sampler(1000),
        on_iteration=lambda out: clock.advance_to(clock.now() + 0.01),
    )
    heard: list[tuple[int, str]] = []

    def front(request_id: int, reason: str) -> None:
        heard.append((request_id, reason))
        loop.cancel(request_id)  # RequestOutput.abort() -> PyExecutor.cancel_request

    refusals.listen(front)
    submit(loop, facts, 1, 16, 30, slo_class="chat", arrival_time=0.0)
    submit(loop, facts, 2, 16, 4, slo_class="chat", arrival_time=0.0)  # waits behind 1
    run(loop, max_iterations=200)
    assert [rid for rid, _ in heard] == [2]
    assert "deadline" in heard[0][1]
    assert loop.finished[2].num_generated == 0, "ended in TensorRT-LLM without a token"
    assert loop.finished[1].num_generated == 30


# ---------------------------------------------------------------- pause past max_input_len


def test_a_request_paused_past_2048_tokens_resumes_on_its_whole_context() -> None:
    """1.2-era executors pause with ``req.pause(self.max_input_len)``, whose default
    (2048, never passed by ``create_py_executor_instance``) would cut a longer request's
    prompt plus generated tokens: the factory lifts the cap to the core's context limit,
    so request 1 (2040 + 200 tokens, preempted by the higher-priority request 2 once
    the pool is full) resumes on everything it had."""
    from orchestrator.core.config import EngineConfig
    from plugins.trtllm.in_executor.factory import scheduler_factory
    from plugins.trtllm.in_executor.settings import InExecutorCore

    modules = fake_release_modules("1.2.1")
    release = inst.load_release(modules.__getitem__)
    engine = EngineConfig.model_validate(
        {
            "model": {"max_model_len": 4096},
            "cache": {"block_size": BS},
            "scheduler": {"policy": "priority", "max_num_tokens": 4096, "chunk_size": 4096},
            "executor": {"type": "sim", "model": "smollm2-135m", "hardware": "l40s"},
        }
    )
    facts = FactsChannel()
    built: list[CoreRequestScheduler] = []
    factory = scheduler_factory(InExecutorCore(engine, 4096), BS, built, lambda: (facts, None))
    loop = modules[inst.CREATOR_MODULE].create_py_executor_instance(num_blocks=140)
    assert loop.max_input_len == 2048, "PyExecutor's default"
    loop.scheduler = factory(loop, release)
    assert loop.max_input_len == 4096, "lifted to the core's context limit"
    with facts.submitting() as staged:
        (first, second) = loop.enqueue_requests(
            [[(3 * i) % 997 + 1 for i in range(2040)], list(range(1, 101))], max_tokens=200
        )
        staged[first] = RequestFacts(priority=1)
        staged[second] = RequestFacts(priority=0)
    paused: dict[int, tuple[int, int]] = {}  # id: (tokens before the pause, prompt after)
    for _ in range(3000):
        if not loop.has_work():
            break
        before = {r.py_request_id: len(r.tokens) for r in loop.active_requests}
        out = loop.iterate()
        paused |= {
            r.py_request_id: (before[r.py_request_id], r.prompt_len) for r in out.paused_requests
        }
    assert list(paused) == [first], "request 1 was paused"
    known, kept = paused[first]
    assert known > 2048 and kept == known, "the pause kept every token"
    tokens = loop.finished[first].tokens
    assert len(tokens) == 2040 + 200
    assert tokens[2040:] == [p % 1000 for p in range(2040, 2240)], "no token lost or redone"


# ---------------------------------------------------------------- the step budget


def test_a_step_over_tensorrt_llms_max_num_tokens_fails_every_active_request() -> None:
    """Why a core budget over TensorRT-LLM's max_num_tokens is refused at start: the
    model engine asserts and _handle_errors ends every active request."""
    facts = FactsChannel()
    trt_kv = FakeKvCacheManager(64, BS)
    adapter = CoreRequestScheduler(
        loop_engine(SchedulerConfig(max_num_tokens=512, chunk_size=512), 64, VirtualClock()),
        types(),
        KvSource(trt_kv),
        facts=facts,
    )
    loop = FakePyExecutor(adapter, trt_kv, position_sampler(1000), max_num_tokens=256)
    submit(loop, facts, 1, 8, 20)
    loop.iterate()
    submit(loop, facts, 2, 400, 4)
    loop.iterate()
    assert sorted(loop.errors) == [1, 2] and "max_num_tokens (256)" in loop.errors[1]


def test_each_iteration_reads_only_the_newest_token_not_the_whole_sequence() -> None:
    facts = FactsChannel()
    loop, _, _ = make_loop(facts=facts)
    submit(loop, facts, 1, 300, 40)
    loop.iterate()  # queued: its prompt is read once
    req = loop.active_requests[0]
    copies = req.num_token_copies
    for _ in range(20):
        loop.iterate()
    assert req.num_token_copies == copies, "no copy of the sequence per iteration"
    run(loop)
    assert len(loop.finished[1].tokens) == 340


# ---------------------------------------------------------------- an error on rank 0


class BlockingDist:
    """``broadcast(obj, root=0)`` between threads as MPI's: a follower blocks, with no
    timeout, until rank 0 broadcasts (``communicator.py`` at ``a1cf28f9``: a collective
    ``Bcast``; a rank that never joins leaves the others waiting)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def broadcast(self, obj: Any, root: int = 0) -> Any:
        if obj is not None:
            self._queue.put(obj)
            return obj
        return self._queue.get()


def test_an_error_in_rank_zeros_scheduler_is_raised_on_every_rank() -> None:
    from plugins.trtllm.in_executor.ranks import RankError

    dist = BlockingDist()
    adapters, loops = [], []
    for rank in (0, 1):
        trt_kv = FakeKvCacheManager(64, BS)
        adapter = CoreRequestScheduler(
            loop_engine(SchedulerConfig(), 64, VirtualClock()),
            types(),
            KvSource(trt_kv),
            link=DistLink(dist, rank),
        )
        adapters.append(adapter)
        loops.append(FakePyExecutor(adapter, trt_kv, position_sampler(1000)))
    for loop in loops:
        loop.submit(FakeLlmRequest(1, list(range(1, 30)), 5))

    def broken(now: float) -> Any:
        raise RuntimeError("the core broke")

    adapters[0].engine.plan_step = broken  # type: ignore[method-assign]
    raised: list[BaseException] = []

    def follow() -> None:
        try:
            loops[1].iterate()
        except BaseException as err:
            raised.append(err)

    follower = threading.Thread(target=follow, daemon=True)  # left blocked if never told
    follower.start()
    with pytest.raises(RuntimeError, match="the core broke"):
        loops[0].iterate()
    follower.join(30.0)
    assert raised, "rank 1 still waits in broadcast for a schedule that never comes"
    assert isinstance(raised[0], RankError) and "the core broke" in str(raised[0])


def test_batch_waiting_would_drop_the_cores_context_chunks() -> None:
    """Why an executor with batch waiting is refused: TensorRT-LLM holds back the
    planned context chunk, so the token the core planned never comes and the request
    fails."""
    facts = FactsChannel()
    trt_kv = FakeKvCacheManager(64, BS)
    adapter = CoreRequestScheduler(
        loop_engine(SchedulerConfig(), 64, VirtualClock()), types(), KvSource(trt_kv), facts=facts
    )
    loop = FakePyExecutor(adapter, trt_kv, position_sampler(1000), enable_batch_waiting=True)
    submit(loop, facts, 1, 8, 20)
    loop.iterate()
    submit(loop, facts, 2, 40, 4)
    loop.iterate()  # request 2's whole prompt planned beside 1's decode: held back
    loop.iterate()
    assert "showed no token" in adapter.refused[2]


# ---------------------------------------------------------------- derived from the release's base


def test_our_scheduler_is_derived_from_the_installed_base_and_inherits_its_methods() -> None:
    class Base(RequestScheduler):
        """A newer base: a concrete method the executor may call on any scheduler."""

        def is_request_in_schedulable_state(self, request: Any) -> bool:
            return bool(request.state == LlmRequestState.CONTEXT_INIT)

    modules = fake_release_modules("1.3.0rc27")
    modules[inst.SCHEDULER_MODULE].RequestScheduler = Base
    release = inst.load_release(modules.__getitem__)
    adapter = release.scheduler_class(
        loop_engine(SchedulerConfig(), 8, VirtualClock()),
        release.types,
        KvSource(FakeKvCacheManager(8, BS)),
    )
    assert isinstance(adapter, Base) and isinstance(adapter, CoreRequestScheduler)
    assert adapter.is_request_in_schedulable_state(FakeLlmRequest(1, [1, 2], 1))


def test_a_base_with_an_abstract_method_we_do_not_provide_is_refused_at_load() -> None:
    class Base(RequestScheduler):
        @abc.abstractmethod
        def schedule_step(self, batch: Any) -> Any: ...

    modules = fake_release_modules("1.3.0rc27")
    modules[inst.SCHEDULER_MODULE].RequestScheduler = Base
    with pytest.raises(TrtllmError, match="schedule_step"):
        inst.load_release(modules.__getitem__)


def test_check_names_reports_a_scheduler_method_the_installed_executor_calls_and_ours_lacks() -> (
    None
):
    class PyExecutor:
        scheduler: Any

        def _schedule(self) -> None:
            self.scheduler.schedule_request([], set())
            self.scheduler.schedule_step(None)

        def _pause_requests(self) -> None: ...

    modules = private_modules("1.2.1")
    modules[names.IN_EXECUTOR_PY_EXECUTOR_MODULE] = pytypes.SimpleNamespace(PyExecutor=PyExecutor)
    status, text = check(modules)
    assert status == 1
    assert "PyExecutor calls self.scheduler.schedule_step" in text
    assert "the in-executor scheduler has none" in text
