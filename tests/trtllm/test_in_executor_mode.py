"""The LLM-API executor with ``scheduling: in_executor``, through the fake LLM API: the
option, the start-up gate, the installation before the LLM is built, the LLM options it
adds, the facts each submission registers, and switching back."""

from __future__ import annotations

import os
import queue
import re
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import ConfigError, EngineConfig
from orchestrator.core.request import SamplingParams
from plugins.trtllm import TrtllmError, names
from plugins.trtllm.in_executor import install as inst
from plugins.trtllm.in_executor.facts import RequestFacts
from plugins.trtllm.llm_api.config import TrtllmLlmApiConfig
from plugins.trtllm.llm_api.executor import TrtllmLlmApiExecutor
from tests.factories import plan_entry
from tests.trtllm import fake_llmapi
from tests.trtllm.builds import FakeBuild, write_build
from tests.trtllm.conftest import LlmCalls, spy_llmapi
from tests.trtllm.fake_pyexecutor import FakeSimpleScheduler, FakeWorkerExecutor
from tests.trtllm.plans import Seq, greedy_tokens, prompt_of, step
from tests.trtllm.test_in_executor import fake_release_modules


def engine_config(root: Path, **executor: Any) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "model": {"max_model_len": 512},
            "scheduler": {"max_batch_size": 8, "max_num_tokens": 256, "policy": "priority"},
            "cache": {"block_size": 16},
            "executor": {"type": "trtllm-llmapi", "build_dir": str(root), **executor},
        }
    )


def overlap_llmapi(calls: LlmCalls, creator: Any) -> types.SimpleNamespace:
    """The spy LLM API, whose LLM also takes ``disable_overlap_scheduler`` (a TorchLlmArgs
    field the fake leaves out) and checks that our factory is installed by then."""
    base = spy_llmapi(calls).LLM

    class LLM(base):  # type: ignore[misc, valid-type]
        def __init__(self, model: Any, *, disable_overlap_scheduler: bool, **kwargs: Any) -> None:
            built = creator.create_py_executor_instance()  # what the worker would do
            calls.options.append({"wrapped_scheduler": built.scheduler, "executor": built})
            calls.options.append({"disable_overlap_scheduler": disable_overlap_scheduler})
            super().__init__(model, **kwargs)

    names = {n: getattr(fake_llmapi, n) for n in fake_llmapi.__all__}
    names["LLM"] = LLM
    return types.SimpleNamespace(**names)


def start(
    tmp_path: Path,
    version: str,
    calls: LlmCalls,
    monkeypatch: pytest.MonkeyPatch,
    build: FakeBuild | None = None,
    llmapi_for: Any = None,
    modules: dict[str, Any] | None = None,
    **options: Any,
) -> Any:
    root = write_build(tmp_path / "pytorch", build or FakeBuild(backend="pytorch"))
    engine = engine_config(root, scheduling="in_executor", **options)
    modules = modules or fake_release_modules(version)
    monkeypatch.setattr(TrtllmLlmApiExecutor, "import_module", staticmethod(modules.__getitem__))
    monkeypatch.delenv(inst.SINGLE_PROCESS_ENV, raising=False)
    llmapi = (llmapi_for or overlap_llmapi)(calls, modules[inst.CREATOR_MODULE])
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    return TrtllmLlmApiExecutor.from_config(options, engine, module=llmapi), modules


def test_the_option_defaults_to_front_and_refuses_other_values() -> None:
    assert TrtllmLlmApiConfig(model="m").scheduling == "front"
    with pytest.raises(ValueError, match="in_executor"):
        TrtllmLlmApiConfig(model="m", scheduling="inside")  # type: ignore[arg-type]


def test_an_unchecked_release_is_refused_at_start_naming_the_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = LlmCalls()
    with pytest.raises(TrtllmError, match=r"checked against TensorRT-LLM 1\.2\.x and 1\.3\.x"):
        start(tmp_path, "1.4.0rc4", calls, monkeypatch)
    assert calls.options == [], "no LLM was built"


def test_without_tensorrt_llm_the_mode_says_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch"))
    engine = engine_config(root, scheduling="in_executor")

    def missing(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(TrtllmLlmApiExecutor, "import_module", staticmethod(missing))
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    with pytest.raises(TrtllmError, match=r"needs TensorRT-LLM 1\.2\.x and 1\.3\.x"):
        TrtllmLlmApiExecutor.from_config(options, engine, module=spy_llmapi(LlmCalls()))


def test_a_checked_release_gets_our_scheduler_before_the_llm_and_facts_per_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugins.trtllm.in_executor.adapter import CoreRequestScheduler

    calls = LlmCalls()
    executor, modules = start(tmp_path, "1.2.1", calls, monkeypatch)
    try:
        wrapped, overlap = calls.options[0], calls.options[1]
        assert isinstance(wrapped["wrapped_scheduler"], CoreRequestScheduler)
        assert overlap == {"disable_overlap_scheduler": True}
        kv = calls.options[2]["kv_cache_config"]
        assert kv.enable_block_reuse is False  # reuse would move TensorRT-LLM's position
        sampling = SamplingParams(max_tokens=3, temperature=0)
        seq = Seq("a", prompt_of(5, 1), blocks=[0], sampling=sampling)
        step(executor, [seq])
        output = calls.submitted[-1][2]
        assert "capacity policy GUARANTEED_NO_EVICT not used" in executor._start_note()
        mode = executor._owned[0]
        facts = mode.facts.take(output.request_id)
        assert facts == RequestFacts(priority=0, slo_class=None, tenant=None, arrival_time=0.0)
    finally:
        executor.shutdown()
    creator = modules[inst.CREATOR_MODULE]
    own = creator.create_py_executor_instance().scheduler
    assert isinstance(own, FakeSimpleScheduler)  # undone


def test_tensor_parallel_is_accepted_and_pipeline_parallel_refused_with_the_way_back(
    tmp_path: Path,
) -> None:
    root = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch", tp=2))
    engine = engine_config(root, scheduling="in_executor")
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    core = TrtllmLlmApiExecutor.resolve(options, engine).in_executor
    assert core is not None and core.tensor_parallel_size == 2
    engine = engine_config(root, scheduling="in_executor", pipeline_parallel_size=2)
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    with pytest.raises(
        ConfigError, match=r"one pipeline-parallel rank.*Remove executor\.scheduling"
    ):
        TrtllmLlmApiExecutor.resolve(options, engine)
    front = options.model_copy(update={"scheduling": "front"})
    assert TrtllmLlmApiExecutor.resolve(front, engine).in_executor is None


def test_a_plans_facts_reach_the_channel_under_the_llms_request_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.core.output import SchedulerOutput

    calls = LlmCalls()
    executor, _ = start(tmp_path, "1.3.0rc27", calls, monkeypatch)
    try:
        sampling = SamplingParams(max_tokens=2, temperature=0)
        planned = plan_entry(
            "r",
            prompt_of(4, 3),
            0,
            [0],
            True,
            sampling,
            priority=2,
            slo_class="chat",
            tenant="acme",
            arrival_time=4.5,
        )
        executor.execute(SchedulerOutput([planned]))
        output = calls.submitted[-1][2]
        facts = executor._owned[0].facts.take(output.request_id)
        assert facts == RequestFacts(priority=2, slo_class="chat", tenant="acme", arrival_time=4.5)
    finally:
        executor.shutdown()


class Worker:
    """TensorRT-LLM's executor thread as far as our scheduler sees it: each request the
    LLM takes is fetched into the executor's ``active_requests`` (a ``FakeLlmRequest``
    whose ``py_client_id`` is the ``RequestOutput``'s id) and one iteration of the fake
    loop runs (schedule, pause, allocate, forward, sample), on a thread of its own, as the
    real loop does after ``generate_async`` returned."""

    def __init__(self, executor: FakeWorkerExecutor) -> None:
        self.executor = executor
        self.scheduler = executor.scheduler
        self._fetched: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def fetch(self, inputs: list[int], params: Any, output: Any) -> None:
        self._fetched.put((list(inputs), params.max_tokens, int(output.request_id)))

    def stop(self) -> None:
        self._fetched.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while (item := self._fetched.get()) is not None:
            inputs, max_tokens, client_id = item
            self.executor.enqueue_requests([inputs], max_tokens, client_ids=[client_id])
            self.executor.iterate()


def refusing_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: LlmCalls
) -> tuple[Any, Worker]:
    """An in-executor executor on the fake LLM API whose installed scheduler (KV pool of
    8 blocks of 16, so it refuses what needs more) sees every submission via ``Worker``.
    Iterations of 20 ms: a refused request would take seconds to end by itself."""
    build = FakeBuild(backend="pytorch", iteration_ms=20.0)
    executor, _ = start(tmp_path, "1.3.0rc27", calls, monkeypatch, build, step_timeout_s=10)
    worker = Worker(calls.options[0]["executor"])
    llm = executor._backend._llm
    generate = llm.generate_async

    def generate_async(inputs: list[int], sampling_params: Any = None, **kw: Any) -> Any:
        output = generate(inputs, sampling_params, **kw)
        worker.fetch(inputs, sampling_params, output)
        return output

    monkeypatch.setattr(llm, "generate_async", generate_async)
    return executor, worker


def wait_finished(output: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not output.finished and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_request_refused_inside_the_loop_fails_at_the_front_and_is_aborted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.core.output import SchedulerOutput

    calls = LlmCalls()
    executor, worker = refusing_executor(tmp_path, monkeypatch, calls)
    try:
        good = Seq(
            "good", prompt_of(5, 1), [0], sampling=SamplingParams(max_tokens=4, temperature=0)
        )
        # 20 + 200 tokens need 14 blocks inside the loop: the core there refuses it.
        bad = Seq(
            "bad", prompt_of(20, 2), [1, 2], sampling=SamplingParams(max_tokens=200, temperature=0)
        )
        failed: dict[str, str] = {}
        for _ in range(3):  # the refusal ends it at its first step, or the next
            live = [q for q in (good, bad) if q.request_id not in failed]
            scheduled = [q.next() for q in live]
            result = executor.execute(SchedulerOutput(scheduled))
            failed.update(result.failed)
            for q, planned in zip(live, scheduled, strict=True):
                if q.request_id not in result.failed:
                    q.advance(planned, result)
            if "bad" in failed:
                break
        assert list(failed) == ["bad"]
        assert re.search(
            r"refused the request: .*needs 14 KV blocks; the KV pool holds 8", failed["bad"]
        )
        while len(good.output) < 4:
            step(executor, [good], finished=["bad"] if len(good.output) == 1 else ())
        assert good.output == greedy_tokens(good.prompt, 4), "the other request carried on"
        bad_output = next(o for i, _, o in calls.submitted if i == bad.prompt)
        wait_finished(bad_output)
        assert bad_output.outputs[0].finish_reason == "cancelled", "aborted in TensorRT-LLM"
        assert list(worker.scheduler.refused.values()) == [failed["bad"]]
    finally:
        worker.stop()
        executor.shutdown()


def test_the_refusal_reaches_the_client_through_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.core import EngineCore, Submission, WallClock
    from orchestrator.core.request import FinishReason

    calls = LlmCalls()
    executor, worker = refusing_executor(tmp_path, monkeypatch, calls)
    try:
        config = engine_config(tmp_path / "pytorch", scheduling="in_executor")
        engine = EngineCore.from_config(config, executor, WallClock())
        greedy = SamplingParams(max_tokens=200, temperature=0)
        engine.add_request(Submission("bad", tuple(prompt_of(20, 2)), greedy))
        short = SamplingParams(max_tokens=6, temperature=0)
        engine.add_request(Submission("good", tuple(prompt_of(5, 1)), short))
        outputs: dict[str, list[Any]] = {"bad": [], "good": []}
        for _ in range(40):
            for out in engine.step().outputs:
                outputs[out.request_id].append(out)
            if not engine.has_work():
                break
        (last,) = [o for o in outputs["bad"] if o.finished]
        assert last.finish_reason == FinishReason.ERROR
        assert last.error is not None and "inside TensorRT-LLM's loop refused" in last.error
        good = [t for o in outputs["good"] for t in o.new_token_ids]
        assert good == greedy_tokens(prompt_of(5, 1), 6), "the other request carried on"
        assert engine.scheduler.kv.num_free_blocks == engine.scheduler.kv.num_blocks
    finally:
        worker.stop()
        executor.shutdown()


class RankZero:
    """What TensorRT-LLM does with more than one rank, for rank 0 only: the proxy submits
    its module's ``worker_main`` (ours, bound to its setup); the worker builds the
    executor through ``create_py_executor_instance`` (here with ``tp_size`` 2) and
    serves until shutdown (here: until ``stop``), on a thread instead of an MPI
    process. The LLM is built once the executor is (the READY signal follows it)."""

    def __init__(self, modules: dict[str, Any]) -> None:
        self.modules = modules
        self.built = threading.Event()
        self.stop = threading.Event()
        self.executor: Any = None
        self.thread: threading.Thread | None = None

    def worker_main(self) -> None:  # TensorRT-LLM's, in the worker module
        self.executor = self.modules[inst.CREATOR_MODULE].create_py_executor_instance(tp_size=2)
        self.built.set()
        self.stop.wait(10)

    def llmapi(self, calls: LlmCalls, creator: Any) -> types.SimpleNamespace:
        base = spy_llmapi(calls).LLM
        rank_zero = self
        proxy = self.modules[names.IN_EXECUTOR_PROXY_MODULE]
        self.modules[names.IN_EXECUTOR_WORKER_MODULE].worker_main = self.worker_main

        class LLM(base):  # type: ignore[misc, valid-type]
            def __init__(self, model: Any, *, disable_overlap_scheduler: bool, **kw: Any) -> None:
                rank_zero.thread = threading.Thread(target=proxy.worker_main, daemon=True)
                rank_zero.thread.start()
                assert rank_zero.built.wait(10)
                super().__init__(model, **kw)

            def shutdown(self) -> None:
                rank_zero.stop.set()
                assert rank_zero.thread is not None
                rank_zero.thread.join(10)
                super().shutdown()

        llmapi_names = {n: getattr(fake_llmapi, n) for n in fake_llmapi.__all__}
        llmapi_names["LLM"] = LLM
        return types.SimpleNamespace(**llmapi_names)


def test_with_two_ranks_facts_reach_rank_zero_over_the_channel_and_refusals_come_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.core.output import SchedulerOutput
    from plugins.trtllm.in_executor.adapter import CoreRequestScheduler

    calls = LlmCalls()
    modules = fake_release_modules("1.3.0rc27")
    rank_zero = RankZero(modules)
    # Iterations of 20 ms and 64 tokens: the request is still running when the refusal
    # lands (it crosses the socket, then the backend's loop).
    build = FakeBuild(backend="pytorch", tp=2, iteration_ms=20.0)
    executor, _ = start(tmp_path, "1.3.0rc27", calls, monkeypatch, build, rank_zero.llmapi, modules)
    proxy = modules[names.IN_EXECUTOR_PROXY_MODULE]
    try:
        assert "capacity policy GUARANTEED_NO_EVICT not used" in executor._start_note()
        mode = executor._owned[0]
        assert mode.host is not None and mode.schedulers == [], "no rank in this process"
        assert os.environ.get(inst.SINGLE_PROCESS_ENV) is None, "workers stay processes"
        adapter = rank_zero.executor.scheduler
        assert isinstance(adapter, CoreRequestScheduler)
        link = adapter._facts  # rank 0's end of the channel
        sampling = SamplingParams(max_tokens=64, temperature=0)
        seq = Seq("a", prompt_of(5, 1), blocks=[0, 1, 2, 3, 4], sampling=sampling)
        step(executor, [seq])
        request_id = int(calls.submitted[-1][2].request_id)
        deadline = time.monotonic() + 10
        while (facts := link.take(request_id)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert facts == RequestFacts(priority=0, slo_class=None, tenant=None, arrival_time=0.0)
        assert link.refuse(request_id, "refused inside the loop") is True
        failed: dict[str, str] = {}
        for _ in range(50):
            planned = seq.next()
            result = executor.execute(SchedulerOutput([planned]))
            failed.update(result.failed)
            if failed:
                break
            seq.advance(planned, result)
        assert failed == {"a": "refused inside the loop"}
    finally:
        executor.shutdown()
    assert not os.path.exists(mode.host.directory), "the channel closed at shutdown"
    assert isinstance(proxy.worker_main, types.FunctionType), "the proxy's own again"


def test_a_step_budget_over_tensorrt_llms_max_num_tokens_is_refused_in_this_mode_only(
    tmp_path: Path,
) -> None:
    root = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch", max_num_tokens=256))
    engine = engine_config(root, scheduling="in_executor")
    engine = engine.model_copy(
        update={"scheduler": engine.scheduler.model_copy(update={"max_num_tokens": 512})}
    )
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    with pytest.raises(ConfigError, match=r"scheduler\.max_num_tokens is 512.*at most 256"):
        TrtllmLlmApiExecutor.resolve(options, engine)
    front = options.model_copy(update={"scheduling": "front"})
    assert TrtllmLlmApiExecutor.resolve(front, engine).in_executor is None


def test_tensorrt_llm_gets_the_cores_context_limit_as_max_seq_len() -> None:
    """A model given without a build leaves max_seq_len to TensorRT-LLM (the model's own,
    which may exceed ours): in this mode it is the core's limit."""
    engine = EngineConfig.model_validate(
        {
            "model": {"max_model_len": 512},
            "scheduler": {"max_batch_size": 8, "max_num_tokens": 256},
            "cache": {"block_size": 32},
            "executor": {"type": "trtllm-llmapi", "model": "org/model"},
        }
    )
    options = TrtllmLlmApiConfig(model="org/model", scheduling="in_executor")
    settings = TrtllmLlmApiExecutor.resolve(options, engine)
    assert settings.max_seq_len == 512 and settings.in_executor is not None
    assert settings.in_executor.max_model_len == 512
    front = options.model_copy(update={"scheduling": "front"})
    assert TrtllmLlmApiExecutor.resolve(front, engine).max_seq_len is None


def test_chunked_prefill_is_forced_on_as_block_reuse_is_forced_off(tmp_path: Path) -> None:
    root = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch"))
    engine = engine_config(root, scheduling="in_executor", enable_chunked_prefill=False)
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    settings = TrtllmLlmApiExecutor.resolve(options, engine)
    assert settings.enable_chunked_prefill is True and settings.enable_block_reuse is False
    front = options.model_copy(update={"scheduling": "front"})
    assert TrtllmLlmApiExecutor.resolve(front, engine).enable_chunked_prefill is False


def test_guided_decoding_is_refused_in_this_mode_with_the_way_back(tmp_path: Path) -> None:
    """TensorRT-LLM's guided decoder builds a fresh grammar matcher for any request on its
    last context chunk (guided_decoder.py at 40bb912b: require_matcher_init); a request
    the core pauses resumes as a context request, so its grammar would restart mid-output."""
    root = write_build(tmp_path / "pytorch", FakeBuild(backend="pytorch"))
    engine = engine_config(root, scheduling="in_executor", guided_decoding_backend="xgrammar")
    options = TrtllmLlmApiConfig.model_validate(engine.executor.options)
    with pytest.raises(ConfigError, match=r"guided_decoding_backend.*Remove executor\.scheduling"):
        TrtllmLlmApiExecutor.resolve(options, engine)
    front = options.model_copy(update={"scheduling": "front"})
    assert TrtllmLlmApiExecutor.resolve(front, engine).guided_decoding_backend == "xgrammar"
