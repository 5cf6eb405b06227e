"""Requests waiting for their grammar: their own state, compiled off the engine thread
with a timeout and a size limit, refused where the executor cannot enforce them."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from orchestrator.core.config import ConstraintsConfig, EngineConfig, SchedulerConfig
from orchestrator.core.constraint import ConstraintError, ConstraintKind, ConstraintSpec
from orchestrator.core.engine import EngineCore
from orchestrator.core.errors import AdmissionError
from orchestrator.core.executor import ExecutorInfo
from orchestrator.core.kv.manager import KVCacheManager
from orchestrator.core.output import SchedulerOutput, StepResult
from orchestrator.core.predictor import StepTimePredictor
from orchestrator.core.request import FinishReason, Request, RequestStatus, Submission
from orchestrator.core.sched.constraints import ConstraintCompiles
from orchestrator.core.sched.scheduler import Scheduler
from tests.factories import constant_step_time, make_engine, make_request
from tests.fakes import FakeExecutor

SCHEMA = ConstraintSpec(ConstraintKind.JSON_SCHEMA, '{"type": "object"}', "response_format")
ALL_KINDS = frozenset(ConstraintKind)


class GatedBackend:
    """Compiles ``spec`` to ``("handle", spec.value)`` once the gate for its value opens;
    a value starting ``bad`` raises ``ConstraintError``. Records what it compiled and on
    which thread."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.compiled: list[str] = []
        self.threads: set[int] = set()

    def gate(self, value: str) -> threading.Event:
        return self.gates.setdefault(value, threading.Event())

    def compile_constraint(self, spec: ConstraintSpec) -> object:
        self.threads.add(threading.get_ident())
        if not self.gate(spec.value).wait(10):
            raise AssertionError("gate never opened")
        if spec.value.startswith("bad"):
            raise ConstraintError(f"cannot parse {spec.value!r}")
        self.compiled.append(spec.value)
        return ("handle", spec.value)


def constrained(value: str, source: str = "response_format", **kw: object) -> Request:
    request = make_request(**kw)  # type: ignore[arg-type]
    request.constraint = ConstraintSpec(ConstraintKind.JSON_SCHEMA, value, source)
    return request


def scheduler_with(
    backend: GatedBackend | None,
    kinds: frozenset[ConstraintKind] = ALL_KINDS,
    timeout_s: float = 5.0,
    max_spec_bytes: int = 4096,
    predictor: StepTimePredictor | None = None,
    **config: object,
) -> Scheduler:
    cfg = SchedulerConfig(
        constraints=ConstraintsConfig(compile_timeout_s=timeout_s, max_spec_bytes=max_spec_bytes),
        **config,  # type: ignore[arg-type]
    )
    compiles = ConstraintCompiles(cfg.constraints, backend, kinds)
    return Scheduler(cfg, KVCacheManager(64, 16, True), 4096, predictor, compiles)


def wait_until_done(scheduler: Scheduler, now: float, limit_s: float = 5.0) -> None:
    """Step the scheduler's compile polling until nothing compiles (bounded)."""
    end = time.monotonic() + limit_s
    while scheduler.constraints and time.monotonic() < end:
        scheduler.constraints.wait(0.01)
        scheduler._take_compiled(now)
    assert not scheduler.constraints, "compile did not finish"


def test_an_executor_without_a_backend_refuses_a_constraint_naming_the_field() -> None:
    scheduler = scheduler_with(None)
    with pytest.raises(AdmissionError, match="tools: the executor cannot enforce") as err:
        scheduler.add_request(constrained("{}", source="tools"), 0.0)
    assert err.value.param == "tools"
    assert "enforces no constraints" in str(err.value)
    assert not scheduler.requests and scheduler.num_waiting == 0


def test_a_kind_the_backend_does_not_enforce_is_refused() -> None:
    scheduler = scheduler_with(GatedBackend(), kinds=frozenset({ConstraintKind.REGEX}))
    with pytest.raises(AdmissionError, match=r"json_schema constraint.*only regex"):
        scheduler.add_request(constrained("{}"), 0.0)
    assert not scheduler.requests


def test_a_compiling_request_is_not_scheduled_and_no_one_waits_on_it() -> None:
    backend = GatedBackend()
    scheduler = scheduler_with(backend)
    slow = constrained("slow")
    plain = make_request(max_tokens=2)
    scheduler.add_request(slow, 0.0)
    scheduler.add_request(plain, 0.0)
    assert slow.status is RequestStatus.WAITING_FOR_GRAMMAR
    for step in range(3):
        plan = scheduler.schedule(0.1 * step)
        assert [s.request_id for s in plan.scheduled] == ([plain.request_id] if step < 2 else [])
        if plan.scheduled:
            scheduler.update(plan, _sample(plan), 0.1 * step)
    assert plain.is_finished and slow.status is RequestStatus.WAITING_FOR_GRAMMAR
    backend.gate("slow").set()
    wait_until_done(scheduler, 1.0)
    assert slow.status is RequestStatus.WAITING
    plan = scheduler.schedule(1.0)
    (entry,) = plan.scheduled
    assert entry.request_id == slow.request_id
    assert entry.constraint == ("handle", "slow")
    assert backend.threads and threading.get_ident() not in backend.threads


def test_a_compile_past_its_deadline_ends_the_request_before_any_token() -> None:
    backend = GatedBackend()
    scheduler = scheduler_with(backend, timeout_s=2.0)
    stuck = constrained("stuck")
    scheduler.add_request(stuck, 10.0)
    assert scheduler.schedule(11.9).is_empty
    assert stuck.status is RequestStatus.WAITING_FOR_GRAMMAR
    plan = scheduler.schedule(12.0)
    assert plan.is_empty and stuck.request_id in plan.finished_ids
    (out,) = scheduler.update(plan, _sample(plan), 12.0)
    assert out.finished and out.finish_reason is FinishReason.ERROR and not out.new_token_ids
    assert out.error_code == "invalid_constraint"
    assert out.error == "response_format: the JSON schema did not compile within 2.0 s"
    backend.gate("stuck").set()  # a late handle is dropped
    time.sleep(0.05)
    assert scheduler.schedule(13.0).is_empty and not scheduler.has_work()


def test_a_spec_over_the_size_limit_is_never_compiled() -> None:
    backend = GatedBackend()
    scheduler = scheduler_with(backend, max_spec_bytes=16)
    big = constrained("x" * 17, source="structured_outputs.regex")
    scheduler.add_request(big, 0.0)
    plan = scheduler.schedule(0.0)
    (out,) = scheduler.update(plan, _sample(plan), 0.0)
    assert out.error_code == "invalid_constraint"
    assert out.error == (
        "structured_outputs.regex: the JSON schema is 17 bytes, over the 16-byte limit "
        "(scheduler.constraints.max_spec_bytes)"
    )
    assert not backend.threads


def test_a_failed_compile_fails_that_request_only() -> None:
    backend = GatedBackend()
    scheduler = scheduler_with(backend)
    bad, good = constrained("bad{", source="tools"), constrained("good")
    plain = make_request(max_tokens=1)
    for r in (bad, good, plain):
        scheduler.add_request(r, 0.0)
    backend.gate("bad{").set()
    backend.gate("good").set()
    wait_until_done(scheduler, 0.0)
    plan = scheduler.schedule(0.0)
    outputs = scheduler.update(plan, _sample(plan), 0.0)
    errors = [o for o in outputs if o.error is not None]
    assert [o.request_id for o in errors] == [bad.request_id]
    assert errors[0].error == "tools: the JSON schema did not compile: cannot parse 'bad{'"
    assert {s.request_id for s in plan.scheduled} == {good.request_id, plain.request_id}


def test_abort_while_compiling_frees_the_request_and_drops_its_compile() -> None:
    backend = GatedBackend()
    scheduler = scheduler_with(backend)
    request = constrained("later")
    scheduler.add_request(request, 0.0)
    assert scheduler.abort(request.request_id, 0.5) is request
    assert request.status is RequestStatus.FINISHED_ABORTED and not scheduler.constraints
    backend.gate("later").set()
    plan = scheduler.schedule(1.0)
    assert plan.is_empty and plan.finished_ids == [request.request_id]
    assert scheduler.update(plan, _sample(plan), 1.0) == []
    assert not scheduler.has_work()


def test_slo_admission_adds_the_expected_compile_time() -> None:
    backend = GatedBackend()
    classes = {"chat": {"ttft_ms": 60_000, "tpot_ms": 1000}}
    scheduler = scheduler_with(
        backend,
        predictor=constant_step_time(0.01),
        slo_classes=classes,
        admission={"type": "slo"},
        default_slo_class="chat",
    )
    compiles = scheduler.constraints
    compiles._seconds.extend([0.5, 3.0, 0.7])  # observed compile times (s): median 0.7
    assert compiles.expected_s(make_request()) == 0.0
    plain, grammar = make_request(prompt_len=32), constrained("g", prompt_len=32)
    scheduler.add_request(plain, 0.0)
    scheduler.abort(plain.request_id, 0.0)
    scheduler.add_request(grammar, 0.0)
    assert plain.predicted_ttft_s is not None and grammar.predicted_ttft_s is not None
    assert grammar.predicted_ttft_s == pytest.approx(plain.predicted_ttft_s + 0.7)
    backend.gate("g").set()


def test_the_engine_refuses_a_constraint_its_executor_cannot_enforce() -> None:
    engine, _ = make_engine()
    submission = Submission("r1", (1, 2, 3), constraint=SCHEMA)
    with pytest.raises(AdmissionError, match="response_format: the executor cannot enforce"):
        engine.add_request(submission)
    assert not engine.has_work()


def test_an_idle_engine_waits_for_a_compile_instead_of_spinning() -> None:
    engine, _ = make_engine()
    backend = GatedBackend()
    engine.scheduler.constraints = ConstraintCompiles(ConstraintsConfig(), backend, ALL_KINDS)
    engine.add_request(Submission("r1", (1, 2, 3), constraint=SCHEMA))
    start = time.monotonic()
    step = engine.step()
    assert step.plan.is_empty and time.monotonic() - start >= 0.004
    backend.gate(SCHEMA.value).set()
    outputs = []
    for _ in range(200):
        outputs += engine.step().outputs
        if outputs and outputs[-1].finished:
            break
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    engine.shutdown()


def _sample(plan: SchedulerOutput) -> StepResult:
    """Token 5 for every entry that samples."""
    return StepResult({s.request_id: 5 for s in plan.scheduled if s.sample}, 0.01)


class ConstrainedFake(FakeExecutor):
    """The fake executor claiming the regex kind, compiling through a gated backend."""

    def __init__(self, backend: GatedBackend | None) -> None:
        super().__init__()
        self.backend = backend

    def info(self) -> ExecutorInfo:
        return dataclasses.replace(
            super().info(), constraint_kinds=frozenset({ConstraintKind.REGEX})
        )

    def compile_constraint(self, spec: ConstraintSpec) -> object:
        assert self.backend is not None
        return self.backend.compile_constraint(spec)


# A valid config naming a registered executor; the tests pass their own instance.
SIM_EXECUTOR = {"type": "sim", "model": "smollm2-135m", "hardware": "l40s"}


def test_from_config_wires_the_executor_as_the_backend_for_its_kinds() -> None:
    backend = GatedBackend()
    config = EngineConfig.model_validate(
        {"model": {"max_model_len": 256}, "executor": SIM_EXECUTOR}
    )
    engine = EngineCore.from_config(config, executor=ConstrainedFake(backend))
    regex = ConstraintSpec(ConstraintKind.REGEX, "[0-9]+", "structured_outputs.regex")
    with pytest.raises(AdmissionError, match="cannot enforce a json_schema constraint"):
        engine.add_request(Submission("s", (1, 2), constraint=SCHEMA))
    engine.add_request(Submission("r", (1, 2), constraint=regex))
    backend.gate("[0-9]+").set()
    plans = []
    for _ in range(200):
        step = engine.step()
        plans.append(step.plan)
        if step.outputs and step.outputs[-1].finished:
            break
    handles = {s.constraint for p in plans for s in p.scheduled}
    assert handles == {("handle", "[0-9]+")}
    engine.shutdown()


def test_an_executor_claiming_kinds_without_a_compile_step_is_refused_at_start() -> None:
    class Claims(FakeExecutor):
        def info(self) -> ExecutorInfo:
            return dataclasses.replace(
                super().info(), constraint_kinds=frozenset({ConstraintKind.REGEX})
            )

    config = EngineConfig.model_validate(
        {"model": {"max_model_len": 256}, "executor": SIM_EXECUTOR}
    )
    with pytest.raises(ValueError, match="no compile_constraint"):
        EngineCore.from_config(config, executor=Claims())
