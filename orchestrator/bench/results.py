"""Result files: per-request records as JSONL, and a summary JSON that ``--compare``
reads back.

The summary's metric names carry their units (``ttft_s``, ``output_throughput_tok_s``);
an undefined value (NaN, e.g. TPOT when no request had two tokens) is written as
``null``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.bench.errors import BenchError
from orchestrator.common.metrics import PERCENTILES, SLO, Distribution, RequestRecord, Summary


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run of a benchmark: its load shape (as JSON, and described in words), its
    offered rate (requests/s; ``None`` for a burst or a closed loop), the metrics, the
    client's p99 lag behind the send schedule (seconds; ``None`` for a closed loop) and
    the records file name, and how many requests were resent once because their
    connection closed before any response (``StreamResult.retries``)."""

    load: dict[str, Any]
    description: str
    rate: float | None
    summary: Summary
    send_lag_p99_s: float | None
    records_file: str
    retries: int = 0


@dataclass(frozen=True, slots=True)
class BenchReport:
    """Everything ``summary.json`` holds: a label for tables, facts about the run (url,
    api, model, seed, workload file, ...) and one entry per run (several for a sweep)."""

    label: str
    meta: dict[str, Any]
    runs: list[RunSummary]


def write_records(path: Path, records: list[RequestRecord]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(asdict(r)) + "\n")


def read_records(path: Path) -> list[RequestRecord]:
    records = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                obj["token_times"] = tuple(obj["token_times"])
                records.append(RequestRecord(**obj))
    return records


def summary_to_json(s: Summary) -> dict[str, Any]:
    return {
        "num_requests": s.num_requests,
        "num_completed": s.num_completed,
        "num_errors": s.num_errors,
        "duration_s": _num(s.duration_s),
        "ttft_s": _dist_to_json(s.ttft),
        "tpot_s": _dist_to_json(s.tpot),
        "itl_s": _dist_to_json(s.itl),
        "e2e_s": _dist_to_json(s.e2e),
        "output_tokens": s.output_tokens,
        "output_throughput_tok_s": _num(s.output_throughput),
        "output_throughput_per_gpu_tok_s": _num(s.output_throughput_per_gpu),
        "request_throughput_req_s": _num(s.request_throughput),
        "goodput_req_s": _num(s.goodput),
        "goodput_fraction": _num(s.goodput_fraction),
        "slo": {"ttft_s": s.slo.ttft_s, "tpot_s": s.slo.tpot_s},
        "errors_by_status": dict(s.errors_by_status),
    }


def summary_from_json(obj: dict[str, Any]) -> Summary:
    return Summary(
        num_requests=obj["num_requests"],
        num_completed=obj["num_completed"],
        num_errors=obj["num_errors"],
        duration_s=_nan(obj["duration_s"]),
        ttft=_dist_from_json(obj["ttft_s"]),
        tpot=_dist_from_json(obj["tpot_s"]),
        itl=_dist_from_json(obj["itl_s"]),
        e2e=_dist_from_json(obj["e2e_s"]),
        output_tokens=obj["output_tokens"],
        output_throughput=_nan(obj["output_throughput_tok_s"]),
        output_throughput_per_gpu=_nan(obj["output_throughput_per_gpu_tok_s"]),
        request_throughput=_nan(obj["request_throughput_req_s"]),
        goodput=_nan(obj["goodput_req_s"]),
        goodput_fraction=_nan(obj["goodput_fraction"]),
        slo=SLO(**obj["slo"]),
        errors_by_status=dict(obj["errors_by_status"]),
    )


def write_report(path: Path, report: BenchReport) -> None:
    runs = [
        {
            "load": r.load,
            "description": r.description,
            "rate": r.rate,
            "summary": summary_to_json(r.summary),
            "send_lag_p99_s": _num(r.send_lag_p99_s) if r.send_lag_p99_s is not None else None,
            "records_file": r.records_file,
            "retries": r.retries,
        }
        for r in report.runs
    ]
    doc = {"label": report.label, **report.meta, "runs": runs}
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def read_report(path: Path) -> BenchReport:
    """Read a ``summary.json``; a file that is not one is a ``BenchError`` naming it."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise BenchError(f"{path}: cannot read: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise BenchError(f"{path}: not JSON: {err.msg}") from None
    try:
        runs = [
            RunSummary(
                load=r["load"],
                description=r["description"],
                rate=r["rate"],
                summary=summary_from_json(r["summary"]),
                send_lag_p99_s=r["send_lag_p99_s"],
                records_file=r["records_file"],
                retries=r.get("retries", 0),  # absent from summaries written before
            )
            for r in doc["runs"]
        ]
        meta = {k: v for k, v in doc.items() if k not in ("label", "runs")}
        return BenchReport(label=doc["label"], meta=meta, runs=runs)
    except (KeyError, TypeError) as err:
        raise BenchError(
            f"{path}: not a benchmark summary (missing or bad {err}); pass the "
            "summary.json that `orchestrator bench` wrote"
        ) from None


def _dist_to_json(d: Distribution) -> dict[str, float | None]:
    return {"mean": _num(d.mean), **{f"p{q}": _num(d.p.get(q, math.nan)) for q in PERCENTILES}}


def _dist_from_json(obj: dict[str, float | None]) -> Distribution:
    return Distribution(_nan(obj["mean"]), {q: _nan(obj[f"p{q}"]) for q in PERCENTILES})


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)
