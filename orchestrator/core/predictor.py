"""Step-time prediction: how long a step of a given shape takes, in seconds.

Admission (the TTFT a new request would see) and the SLO token budget (the largest
prefill that keeps a step under the tightest TPOT target) both ask this question before
the step exists, so they ask it of a step's *features*, not of a plan.

The seam: ``EngineCore`` takes a ``StepTimePredictor`` and, after every step, tells it
the features and the measured duration. By default it is ``LinearStepTimePredictor``, a
least-squares fit over a recent window of measured steps, which needs nothing from the
executor, so every executor (torch, TensorRT-LLM, any plug-in) gets one without a new
capability flag. The simulator passes a ``ModelStepTimePredictor`` over its roofline
cost model instead: its step durations *are* that model, so the prediction is exact and
the simulated admission decisions are the ones a perfect predictor would make. Either
way the engine tracks the predictor's relative error over a window (``ErrorWindow``),
which the gateway exports and the benchmarks report.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol

from orchestrator.core.config import PredictorConfig, StepTimePrior
from orchestrator.core.output import SchedulerOutput


class StepFeatures(NamedTuple):
    """The shape of one step.

    ``num_tokens``: tokens run (decode tokens plus prefill chunks); ``num_seqs``:
    requests in the step; ``num_samples``: requests that sample a token;
    ``context_tokens``: cached positions the step's requests attend over (K/V read);
    ``attention_pairs``: (query, attended position) pairs over all new tokens, causal.
    """

    num_tokens: int
    num_seqs: int
    num_samples: int
    context_tokens: int
    attention_pairs: int


def features_of(plan: SchedulerOutput) -> StepFeatures:
    """The features of a plan (one pass over its scheduled requests)."""
    tokens = samples = context = pairs = 0
    for s in plan.scheduled:
        n = len(s.token_ids)
        p = s.start_position
        tokens += n
        samples += s.sample
        context += p
        pairs += n * p + n * (n + 1) // 2
    return StepFeatures(tokens, len(plan.scheduled), samples, context, pairs)


def mixed_step(
    decode_seqs: int, decode_context: int, prefill_tokens: int, prefill_seqs: int = 1
) -> StepFeatures:
    """A hypothetical step: ``decode_seqs`` decodes over ``decode_context`` cached tokens
    in all, plus ``prefill_tokens`` of fresh prompt in ``prefill_seqs`` chunks (each
    attending to itself only; earlier context of a chunked prompt is left out)."""
    prefill_seqs = prefill_seqs if prefill_tokens else 0
    per_chunk = prefill_tokens // prefill_seqs if prefill_seqs else 0
    pairs = decode_context + decode_seqs + prefill_seqs * per_chunk * (per_chunk + 1) // 2
    return StepFeatures(
        decode_seqs + prefill_tokens,
        decode_seqs + prefill_seqs,
        decode_seqs + prefill_seqs,
        decode_context,
        pairs,
    )


class StepTimePredictor(Protocol):
    """Predicts a step's duration (seconds) from its features.

    ``predict`` is called several times per step and at every submission, so it must
    be cheap (microseconds) and never negative. ``observe`` is told each executed step's
    features and measured duration (seconds); a model-based predictor may ignore it.
    """

    def predict(self, features: StepFeatures) -> float: ...

    def observe(self, features: StepFeatures, duration_s: float) -> None: ...


class ModelStepTimePredictor:
    """Wraps a function of the features, e.g. the simulator's cost model, that is the
    step time; ``observe`` has nothing to learn."""

    def __init__(self, model: Callable[[StepFeatures], float]) -> None:
        self._model = model

    def predict(self, features: StepFeatures) -> float:
        return max(0.0, self._model(features))

    def observe(self, features: StepFeatures, duration_s: float) -> None:
        """Nothing to fit: the model is the step time."""


# Observed step times above this multiple of the prediction are capped at it.
OUTLIER_FACTOR = 3.0

# Feature scales: coefficients are fitted in these units so that the normal equations
# are well conditioned (a step has ~1e3 tokens but ~1e7 attention pairs).
_SCALES = (1.0, 1e-3, 1e-2, 1e-5, 1e-7)


def _vector(f: StepFeatures) -> tuple[float, ...]:
    return (
        1.0,
        f.num_tokens * _SCALES[1],
        f.num_seqs * _SCALES[2],
        f.context_tokens * _SCALES[3],
        f.attention_pairs * _SCALES[4],
    )


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; ``None`` if ``a`` is singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-18:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            factor = m[r][col] / m[col][col]
            if factor:
                for c in range(col, n + 1):
                    m[r][c] -= factor * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


class LinearStepTimePredictor:
    """``duration = c0 + c1 tokens + c2 seqs + c3 context + c4 pairs``, fitted by ridge
    least squares over the last ``config.window`` observed steps, pulled towards the
    prior coefficients with the weight of ``config.prior_weight`` steps.

    Pure Python: the normal equations (5 x 5) are kept as running sums, updated in
    O(25) per observed step (the step leaving the window is subtracted), and solved every
    ``refit_every`` steps. A coefficient the fit makes negative is clamped to 0 (no
    feature makes a step faster), and a prediction is never below 0. An observed
    duration counts as at most ``OUTLIER_FACTOR`` x the prediction of the moment.
    """

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        p = self.config.prior
        natural = (p.overhead_s, p.per_token_s, p.per_seq_s, p.per_context_token_s, p.per_pair_s)
        self._prior = [c / s for c, s in zip(natural, _SCALES, strict=True)]
        self.coefficients = list(self._prior)  # in scaled units
        self._window: deque[tuple[tuple[float, ...], float]] = deque()
        self._xtx = [[0.0] * 5 for _ in range(5)]
        self._xty = [0.0] * 5
        self._since_fit = 0

    def predict(self, features: StepFeatures) -> float:
        c = self.coefficients
        s = _SCALES
        t = (
            c[0]
            + c[1] * features.num_tokens * s[1]
            + c[2] * features.num_seqs * s[2]
            + c[3] * features.context_tokens * s[3]
            + c[4] * features.attention_pairs * s[4]
        )
        return t if t > 0.0 else 0.0

    def observe(self, features: StepFeatures, duration_s: float) -> None:
        x = _vector(features)
        # A one-off stall (warm-up, a noisy neighbour) would drag a least-squares fit for a
        # whole window; capped at OUTLIER_FACTOR x the current prediction it cannot,
        # while a real shift still gets through, the cap rising with every refit.
        y = min(duration_s, OUTLIER_FACTOR * max(self.predict(features), 1e-3))
        self._accumulate(x, y, 1.0)
        self._window.append((x, y))
        if len(self._window) > self.config.window:
            old_x, old_y = self._window.popleft()
            self._accumulate(old_x, old_y, -1.0)
        self._since_fit += 1
        if self._since_fit >= self.config.refit_every:
            self.refit()

    def _accumulate(self, x: tuple[float, ...], y: float, sign: float) -> None:
        xtx, xty = self._xtx, self._xty
        for i in range(5):
            xi = sign * x[i]
            xty[i] += xi * y
            row = xtx[i]
            for j in range(5):
                row[j] += xi * x[j]

    def refit(self) -> None:
        """Solve the ridge normal equations now: ``(X'X + l I) c = X'y + l prior``."""
        self._since_fit = 0
        lam = self.config.prior_weight
        # The ridge term is relative to the typical size of each feature in the window,
        # so that the prior counts as ``prior_weight`` steps whatever the units.
        n = max(len(self._window), 1)
        a = [row[:] for row in self._xtx]
        b = self._xty[:]
        for i in range(5):
            scale = lam * max(a[i][i] / n, 1e-12)
            a[i][i] += scale
            b[i] += scale * self._prior[i]
        solved = _solve(a, b)
        if solved is not None:
            self.coefficients = [max(0.0, c) for c in solved]

    @property
    def prior_coefficients(self) -> StepTimePrior:
        """The current fit in the prior's units (what ``orchestrator calibrate`` prints)."""
        c = [v * s for v, s in zip(self.coefficients, _SCALES, strict=True)]
        return StepTimePrior(
            overhead_s=c[0],
            per_token_s=c[1],
            per_seq_s=c[2],
            per_context_token_s=c[3],
            per_pair_s=c[4],
        )


def fit_prior(samples: Iterable[tuple[StepFeatures, float]]) -> StepTimePrior:
    """Fit the linear model to measured ``(features, seconds)`` steps (calibration)."""
    predictor = LinearStepTimePredictor(PredictorConfig(window=100_000, prior_weight=1e-3))
    # Calibration's steps are deliberate measurements: no outlier cap.
    for features, seconds in samples:
        x = _vector(features)
        predictor._accumulate(x, seconds, 1.0)
        predictor._window.append((x, seconds))
    predictor.refit()
    return predictor.prior_coefficients


class ErrorWindow:
    """Relative errors ``|predicted - actual| / actual`` of the last ``size`` predictions.

    ``median`` is ``None`` before the first one. Actual values of 0 are skipped (an empty
    step has no relative error).
    """

    def __init__(self, size: int = 512) -> None:
        self._errors: deque[float] = deque(maxlen=size)
        self.count = 0
        # The median as of ``_median_count`` observations: the engine snapshots its
        # stats every step, so a window is sorted again only once it has changed.
        self._median: float | None = None
        self._median_count = 0

    def observe(self, predicted: float, actual: float) -> None:
        if actual > 0:
            self._errors.append(abs(predicted - actual) / actual)
            self.count += 1

    @property
    def median(self) -> float | None:
        if self._median_count != self.count:
            ordered = sorted(self._errors)
            mid = len(ordered) // 2
            self._median = (
                ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
            )
            self._median_count = self.count
        return self._median
