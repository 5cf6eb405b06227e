"""The engine's own metrics as Prometheus families, for every process that serves an
``EngineCore``: ``orchestrator serve``'s ``/metrics`` and the Dynamo worker's system
port export the same names and meanings from ``EngineStats``.

Imported by the processes that export metrics only (prometheus-client is one of their
dependencies, not the core's).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from orchestrator.core import EngineStats, PredictorState


def kv_cache_usage(stats: EngineStats) -> float:
    """The fraction of KV blocks in use (0..1; 0 for an empty pool)."""
    return stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0


def engine_metric_families(stats: EngineStats, prefix: str = "orchestrator") -> Iterator[Metric]:
    """The engine's gauges and counters as of ``stats`` (its last step), named
    ``<prefix>_...``: batch and queue sizes, KV blocks, preemptions, shed requests,
    refusals and regretted refusals by SLO class, and the predictors' state and errors."""
    gauges = {
        "num_requests_running": ("Requests in the running batch.", stats.num_running),
        "num_requests_waiting": ("Requests waiting for admission.", stats.num_waiting),
        "kv_blocks_used": ("KV cache blocks held by live requests.", stats.kv_blocks_used),
        "kv_blocks_total": ("KV cache blocks in the pool.", stats.kv_blocks_total),
    }
    for name, (doc, value) in gauges.items():
        yield GaugeMetricFamily(f"{prefix}_{name}", doc, value=value)
    yield GaugeMetricFamily(
        f"{prefix}_kv_cache_usage_ratio",
        "Fraction of KV blocks in use (0..1).",
        value=kv_cache_usage(stats),
    )
    yield CounterMetricFamily(
        f"{prefix}_preemptions",
        "Requests preempted (recompute) since start.",
        value=stats.num_preemptions,
    )
    yield CounterMetricFamily(
        f"{prefix}_requests_shed",
        "Waiting requests ended past their SLO class's TTFT deadline since start.",
        value=stats.num_shed,
    )
    rejections = CounterMetricFamily(
        f"{prefix}_slo_rejections",
        "Submissions refused with 429 since start, by SLO class ('' for none) and "
        "reason code (ttft_unattainable, queue_full, queue_tokens_full).",
        labels=["slo_class", "code"],
    )
    for slo_class, code, count in stats.rejections:
        rejections.add_metric([slo_class, code], count)
    yield rejections
    regretted = CounterMetricFamily(
        f"{prefix}_admission_regretted_refusals",
        "Refusals since start whose request would have met its TTFT target, as "
        "estimated from when the requests ahead of it got their first token, by SLO "
        "class ('' for none).",
        labels=["slo_class"],
    )
    for slo_class, count in stats.regretted_refusals:
        regretted.add_metric([slo_class], count)
    yield regretted
    by_class = GaugeMetricFamily(
        f"{prefix}_ttft_prediction_error_by_class",
        "Median relative error of SLO admission's TTFT predictions per SLO class (recent window).",
        labels=["slo_class"],
    )
    for slo_class, class_error in stats.ttft_prediction_error_by_class:
        by_class.add_metric([slo_class], class_error)
    yield by_class
    yield GaugeMetricFamily(
        f"{prefix}_step_time_predictor_trusted",
        "1 while SLO admission acts on the step-time predictor; 0 while it falls back "
        "to queue limits (no fit measured here yet, or its recent error over its bound).",
        value=float(stats.predictor_state is PredictorState.TRUSTED),
    )
    state = GaugeMetricFamily(
        f"{prefix}_step_time_predictor_state",
        "The step-time predictor's state: 1 for the current one (trusted, uncalibrated, drifting).",
        labels=["state"],
    )
    for candidate in PredictorState:
        state.add_metric([candidate.value], float(candidate is stats.predictor_state))
    yield state
    # Median |predicted - actual| / actual over recent steps / first tokens; absent
    # until there is one.
    errors = {
        "step_time_prediction_error": stats.step_time_error,
        "ttft_prediction_error": stats.ttft_prediction_error,
    }
    for name, error in errors.items():
        if error is not None:
            yield GaugeMetricFamily(
                f"{prefix}_{name}",
                f"Median relative error of the engine's {name.split('_pred')[0]} "
                "predictions (recent window).",
                value=error,
            )
