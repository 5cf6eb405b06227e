"""SLO scheduling in the simulator: the exact predictor, per-class reports, refusals and
shed requests recorded with their reason, and the workload's class and tenant mix."""

from __future__ import annotations

from pathlib import Path

from orchestrator.common.workloads import TrafficClass, build_workload
from orchestrator.core import SchedulerConfig
from orchestrator.sim.config import SimConfig, load_sim_config
from orchestrator.sim.runner import at_rate, run_simulation

CONFIG = Path(__file__).resolve().parents[2] / "configs/sim/llama3-70b-fp8-h100-tp2.yaml"
CLASSES = {"interactive": {"ttft_ms": 500, "tpot_ms": 80}}


def slo_config(rate: float, **scheduler: object) -> SimConfig:
    config = load_sim_config(CONFIG)
    data = config.engine.scheduler.model_dump()
    data.update(slo_classes=CLASSES, default_slo_class="interactive", **scheduler)
    engine = config.engine.model_copy(update={"scheduler": SchedulerConfig.model_validate(data)})
    workload = config.workload.model_copy(
        update={"num_requests": 300, "slo_classes": {"interactive": TrafficClass(share=1)}}
    )
    return at_rate(config.model_copy(update={"engine": engine, "workload": workload}), rate)


def test_the_simulated_predictor_is_exact_and_classes_are_reported() -> None:
    result = run_simulation(slo_config(10.0, policy="slo", admission={"type": "slo"}))
    report = result.report
    assert report.step_time_error == 0.0
    c = report.by_class["interactive"]
    assert c.num_requests == 300 and c.attainment > 0.95
    assert c.ttft_prediction_error is not None and c.ttft_prediction_error < 0.5


def test_overload_refusals_and_sheds_are_recorded_with_reasons() -> None:
    config = slo_config(
        60.0,
        policy="slo",
        admission={"type": "slo", "ttft_margin": 0.8, "shed_after_deadline_s": 0.0},
        slo_budget={"enabled": True},
    )
    result = run_simulation(config)
    c = result.report.by_class["interactive"]
    assert c.rejections.get("ttft_unattainable", 0) > 0
    assert c.num_requests == 300  # nothing lost: every request is a record
    # Admitted requests mostly make it: attainment counts refusals as misses only.
    completed = [r for r in result.run.records if r.ok]
    met = sum(1 for r in completed if r.ttft is not None and r.ttft <= 0.5)
    assert met / len(completed) > 0.9
    fcfs = run_simulation(slo_config(60.0))
    assert c.num_met > 2 * fcfs.report.by_class["interactive"].num_met


def test_shed_requests_are_recorded_with_their_reason() -> None:
    result = run_simulation(slo_config(60.0, admission={"shed_after_deadline_s": 0.0}))
    c = result.report.by_class["interactive"]
    assert c.num_requests == 300 and c.rejections.get("ttft_deadline_passed", 0) > 0
    assert result.run.replicas[0].core.stats().num_shed == c.rejections["ttft_deadline_passed"]


def test_the_workload_mix_keeps_arrivals_and_lengths() -> None:
    config = load_sim_config(CONFIG).workload.model_copy(update={"num_requests": 200})
    plain = build_workload(config)
    mixed = build_workload(
        config.model_copy(
            update={
                "slo_classes": {"a": TrafficClass(share=3), "b": TrafficClass(share=1, priority=2)},
                "tenants": {"heavy": 10, "light": 1},
            }
        )
    )
    assert [(r.arrival_time, r.prompt_len) for r in plain.requests] == [
        (r.arrival_time, r.prompt_len) for r in mixed.requests
    ]
    light = sum(1 for r in mixed.requests if r.tenant == "light")
    assert 5 <= light <= 40
    assert all(r.priority == (2 if r.slo_class == "b" else 0) for r in mixed.requests)


def test_tune_searches_the_admission_margin_and_the_slo_budget() -> None:
    from orchestrator.sim.tune import knob_grid, with_knobs

    grid = knob_grid([512], [8192], [128], [0.8, 1.0], [True, False])
    assert len(grid) == 4
    config = with_knobs(slo_config(10.0, admission={"type": "slo"}), grid[0])
    scheduler = config.engine.scheduler
    assert scheduler.admission.ttft_margin == 0.8 and scheduler.slo_budget.enabled
    kept = with_knobs(slo_config(10.0), knob_grid([256], [8192], [128])[0]).engine.scheduler
    assert kept.admission.ttft_margin == 1.0 and not kept.slo_budget.enabled


def test_calibration_writes_a_predictor_prior(tmp_path: Path) -> None:
    import yaml

    from orchestrator.core import LinearStepTimePredictor, features_of
    from orchestrator.core import SchedulerConfig as Config
    from orchestrator.sim.calibrate import SHAPES, shape_plan, write_predictor_prior

    # Measured times of a machine where a step costs 5 ms plus 0.1 ms per token.
    measured = {name: 0.005 + 1e-4 * sum(n for n, _ in shape) for name, shape in SHAPES.items()}
    path = write_predictor_prior(tmp_path, 16, measured)
    section = yaml.safe_load(path.read_text())
    predictor = LinearStepTimePredictor(Config(predictor=section["predictor"]).predictor)
    for name, seconds in measured.items():
        predicted = predictor.predict(features_of(shape_plan(SHAPES[name], 16)))
        assert abs(predicted - seconds) / seconds < 0.05, name
