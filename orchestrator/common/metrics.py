"""The four serving metrics, defined once for the simulator, the benchmark client and
the gateway.

- TTFT: arrival to first output token.
- TPOT: (last token time - first token time) / (output tokens - 1), per request.
- ITL: gap between two consecutive token arrivals of one request (a streamed chunk that
  carries several tokens counts as one arrival).
- Throughput: output tokens per second (and per GPU).
- Goodput: completed requests per second, and their fraction, meeting every SLO.

All times are seconds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

PERCENTILES: tuple[int, ...] = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as seen by whoever measured it.

    ``token_times`` are the arrival times of output tokens (or of streamed chunks), on
    the same clock as ``arrival_time``. ``num_output_tokens`` may exceed
    ``len(token_times)`` when chunks carry several tokens. ``error`` is ``None`` for a
    completed request; ``error_code`` is the server's reason code when it gave one
    (e.g. ``ttft_unattainable``, ``queue_full``, ``ttft_deadline_passed``).
    ``slo_class`` and ``tenant`` are what the request was sent as; ``predicted_ttft``
    (s) is the server's TTFT prediction at admission, when it made one.
    """

    request_id: str
    arrival_time: float
    token_times: tuple[float, ...]
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None
    status_code: int | None = None
    error_code: str | None = None
    slo_class: str | None = None
    tenant: str | None = None
    predicted_ttft: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.num_output_tokens > 0 and bool(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def tpot(self) -> float | None:
        """``None`` for requests with fewer than two output tokens (no decode phase)."""
        if len(self.token_times) < 2 or self.num_output_tokens < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.num_output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def e2e(self) -> float | None:
        return self.token_times[-1] - self.arrival_time if self.token_times else None


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives in seconds; ``None`` means no bound on that metric."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        if not r.ok:
            return False
        ttft, tpot = r.ttft, r.tpot
        if self.ttft_s is not None and (ttft is None or ttft > self.ttft_s):
            return False
        if self.e2e_s is not None and (r.e2e is None or r.e2e > self.e2e_s):
            return False
        # A one-token request has no TPOT; it cannot miss a TPOT bound.
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no values."""
    return _sorted_percentile(sorted(values), q)


def _sorted_percentile(s: Sequence[float], q: float) -> float:
    if not s:
        return math.nan
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Mean and percentiles of one metric, in seconds."""

    mean: float
    p: dict[int, float] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        mean = sum(values) / len(values) if values else math.nan
        ordered = sorted(values)  # once, not once per percentile
        return cls(mean, {q: _sorted_percentile(ordered, q) for q in PERCENTILES})


@dataclass(frozen=True, slots=True)
class Summary:
    """Aggregate of a run. Rates are per second of ``duration_s``."""

    num_requests: int
    num_completed: int
    num_errors: int
    duration_s: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    output_tokens: int
    output_throughput: float
    output_throughput_per_gpu: float
    request_throughput: float
    goodput: float
    goodput_fraction: float
    slo: SLO
    errors_by_status: dict[str, int]


def summarize(
    records: Iterable[RequestRecord],
    duration_s: float,
    slo: SLO | None = None,
    num_gpus: int = 1,
    class_slos: Mapping[str, SLO] | None = None,
) -> Summary:
    """Aggregate per-request records over a run of ``duration_s`` seconds.

    Latency distributions cover completed requests only; goodput counts completed
    requests that meet every bound of their SLO (their class's in ``class_slos``, else
    ``slo``), its fraction is over all requests.
    """
    recs = list(records)
    slo = slo or SLO()
    met = _judge(slo, class_slos)
    done = [r for r in recs if r.ok]
    errors: dict[str, int] = {}
    for r in recs:
        if not r.ok:
            key = str(r.status_code) if r.status_code is not None else (r.error or "no tokens")
            errors[key] = errors.get(key, 0) + 1
    out_tokens = sum(r.num_output_tokens for r in done)
    good = sum(1 for r in done if met(r))
    dur = duration_s if duration_s > 0 else math.nan
    return Summary(
        num_requests=len(recs),
        num_completed=len(done),
        num_errors=len(recs) - len(done),
        duration_s=duration_s,
        ttft=Distribution.of([t for r in done if (t := r.ttft) is not None]),
        tpot=Distribution.of([t for r in done if (t := r.tpot) is not None]),
        itl=Distribution.of([g for r in done for g in r.itls]),
        e2e=Distribution.of([t for r in done if (t := r.e2e) is not None]),
        output_tokens=out_tokens,
        output_throughput=out_tokens / dur,
        output_throughput_per_gpu=out_tokens / dur / max(num_gpus, 1),
        request_throughput=len(done) / dur,
        goodput=good / dur,
        goodput_fraction=good / len(recs) if recs else math.nan,
        slo=slo,
        errors_by_status=errors,
    )


def _judge(slo: SLO, class_slos: Mapping[str, SLO] | None) -> Callable[[RequestRecord], bool]:
    if not class_slos:
        return slo.met_by

    def met(r: RequestRecord) -> bool:
        own = class_slos.get(r.slo_class, slo) if r.slo_class is not None else slo
        return own.met_by(r)

    return met


@dataclass(frozen=True, slots=True)
class ClassSummary:
    """One SLO class of a run: requests sent, requests meeting the class's SLO, their
    share (attainment), refusals and early ends by reason code, and the median relative
    error ``|predicted - actual| / actual`` of the server's TTFT predictions (``None``
    when it made none)."""

    name: str
    slo: SLO
    num_requests: int
    num_met: int
    rejections: dict[str, int]
    ttft_prediction_error: float | None

    @property
    def attainment(self) -> float:
        return self.num_met / self.num_requests if self.num_requests else math.nan

    @property
    def num_rejected(self) -> int:
        return sum(self.rejections.values())


def summarize_by_class(
    records: Iterable[RequestRecord], class_slos: Mapping[str, SLO], default: SLO
) -> dict[str, ClassSummary]:
    """Per-class attainment, refusals and TTFT prediction error; records without a class
    are grouped under ``"-"`` and judged by ``default``."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(r.slo_class if r.slo_class is not None else "-", []).append(r)
    out = {}
    for name, recs in sorted(groups.items()):
        slo = class_slos.get(name, default)
        rejections: dict[str, int] = {}
        for r in recs:
            if not r.ok:
                code = r.error_code or (str(r.status_code) if r.status_code else "error")
                rejections[code] = rejections.get(code, 0) + 1
        errors = [
            abs(r.predicted_ttft - ttft) / ttft
            for r in recs
            if r.predicted_ttft is not None and (ttft := r.ttft) is not None and ttft > 0
        ]
        out[name] = ClassSummary(
            name,
            slo,
            len(recs),
            sum(1 for r in recs if slo.met_by(r)),
            rejections,
            percentile(errors, 50) if errors else None,
        )
    return out
