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
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
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


class PredictorState(Enum):
    """Whether admission may act on a predictor's step times.

    ``TRUSTED``: measured on this executor (calibrated at start), given by the operator,
    or confirmed by recent steps; ``UNCALIBRATED``: a default prior not yet confirmed by
    ``MIN_TRUST_STEPS`` steps; ``DRIFTING``: the recent error is above ``TRUST_ERROR``,
    or the fit restarted after the true cost changed and has not yet been confirmed.
    """

    TRUSTED = "trusted"
    UNCALIBRATED = "uncalibrated"
    DRIFTING = "drifting"


class StepTimePredictor(Protocol):
    """Predicts a step's duration (seconds) from its features.

    ``predict`` is called several times per step and at every submission, so it must
    be cheap (microseconds) and never negative. ``observe`` is told each executed step's
    features and measured duration (seconds); a model-based predictor may ignore it.
    ``state`` says whether admission may act on its predictions (``trusted``); while it
    may not, SLO admission falls back to queue limits.
    """

    @property
    def state(self) -> PredictorState: ...

    @property
    def trusted(self) -> bool: ...

    def predict(self, features: StepFeatures) -> float: ...

    def observe(self, features: StepFeatures, duration_s: float) -> None: ...


class ModelStepTimePredictor:
    """Wraps a function of the features, e.g. the simulator's cost model, that is the
    step time; ``observe`` has nothing to learn, and it is always trusted."""

    state = PredictorState.TRUSTED
    trusted = True

    def __init__(self, model: Callable[[StepFeatures], float]) -> None:
        self._model = model

    def predict(self, features: StepFeatures) -> float:
        return max(0.0, self._model(features))

    def observe(self, features: StepFeatures, duration_s: float) -> None:
        """Nothing to fit: the model is the step time."""


# Observed step times above this multiple of the prediction are capped at it, so that a
# one-off stall (first use of a shape, a noisy neighbour) cannot drag the fit.
OUTLIER_FACTOR = 3.0
# Steps in the recent windows of measured/predicted ratios and relative errors.
RECENT_STEPS = 16
# Steps a fit must have seen before its error can make it trusted (or untrusted).
MIN_TRUST_STEPS = 8
# A median relative error over the recent steps above this: the fit is not trusted.
TRUST_ERROR = 0.5
# A median measured/predicted ratio outside [1 / DRIFT_RATIO, DRIFT_RATIO] over the
# recent steps: the true cost has changed; the fit restarts from its own shape, rescaled.
DRIFT_RATIO = 1.5

# Feature scales: coefficients are fitted in these units so that the normal equations
# are well conditioned (a step has ~1e3 tokens but ~1e7 attention pairs).
_SCALES = (1.0, 1e-3, 1e-2, 1e-5, 1e-7)

# Where the prior speaks for itself in the fit: one pseudo-step at each of these shapes
# (decodes at three batch sizes and contexts, prefill chunks of three sizes, one mixed
# step), timed by the prior. They span all five features, so a window of steps that all
# look alike (decodes, whose tokens equal their requests) moves the fit only along the
# directions it measures, and the prior keeps the others (see ``refit``).
ANCHOR_SHAPES = (
    mixed_step(1, 128, 0),
    mixed_step(16, 16 * 256, 0),
    mixed_step(64, 64 * 512, 0),
    mixed_step(0, 0, 32),
    mixed_step(0, 0, 256),
    mixed_step(0, 0, 512),
    mixed_step(8, 8 * 256, 256),
)


def _vector(f: StepFeatures) -> tuple[float, ...]:
    return (
        1.0,
        f.num_tokens * _SCALES[1],
        f.num_seqs * _SCALES[2],
        f.context_tokens * _SCALES[3],
        f.attention_pairs * _SCALES[4],
    )


def _scaled(prior: StepTimePrior) -> list[float]:
    natural = (
        prior.overhead_s,
        prior.per_token_s,
        prior.per_seq_s,
        prior.per_context_token_s,
        prior.per_pair_s,
    )
    return [c / s for c, s in zip(natural, _SCALES, strict=True)]


def _dot(c: Sequence[float], x: Sequence[float]) -> float:
    return sum(ci * xi for ci, xi in zip(c, x, strict=True))


def _median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


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


def _solve_nonnegative(a: list[list[float]], b: list[float]) -> list[float] | None:
    """The least-squares solution of the normal equations ``a c = b`` with every
    ``c >= 0`` (no feature makes a step faster): a coefficient that comes out negative
    is fixed at 0 and the rest solved again, so the others absorb what it explained
    instead of the prediction rising by what it took away. At most 5 rounds."""
    fixed: set[int] = set()
    solved: list[float] | None = None
    for _ in range(5):
        m = [
            [(1.0 if i == j else 0.0) if i in fixed or j in fixed else v for j, v in enumerate(row)]
            for i, row in enumerate(a)
        ]
        rhs = [0.0 if i in fixed else v for i, v in enumerate(b)]
        solved = _solve(m, rhs)
        if solved is None:
            return None
        negative = {i for i, c in enumerate(solved) if c < 0}
        if not negative:
            return solved
        fixed |= negative
    return [max(0.0, c) for c in solved] if solved is not None else None


class LinearStepTimePredictor:
    """``duration = c0 + c1 tokens + c2 seqs + c3 context + c4 pairs`` (seconds), fitted
    by least squares over the last ``config.window`` observed steps plus the prior's
    ``ANCHOR_SHAPES``, which count as ``config.prior_weight`` steps in all.

    The prior is, in order: a fit measured at start (``calibrate``), the configured
    ``config.prior`` (an operator's override), or ``StepTimePrior()``'s defaults, which
    were measured nowhere in particular: until ``MIN_TRUST_STEPS`` steps confirm them the
    state is ``UNCALIBRATED``, and admission does not act on them (``trusted``).

    Bounds, whatever the prior:

    - outliers: an observed duration counts as at most ``OUTLIER_FACTOR`` x the
      prediction of the moment;
    - runaway: the prior holds every direction of the five features that the window
      does not measure, so decode-only steps cannot put their cost on prefill tokens;
    - drift: when the median measured/predicted ratio of the last ``RECENT_STEPS`` steps
      leaves ``[1/DRIFT_RATIO, DRIFT_RATIO]`` (a slower or faster machine, a new dtype),
      the window is dropped and the prior becomes the current fit times that ratio, so a
      shift of any size is caught within ``RECENT_STEPS // 2 + 1`` steps of it and the
      fit is rescaled at once; it is trusted again once the median error of
      ``MIN_TRUST_STEPS`` steps is under ``TRUST_ERROR``.

    Pure Python: the normal equations (5 x 5) are kept as running sums, updated in
    O(25) per observed step (the step leaving the window is subtracted), and solved at
    every step for the first ``2 x refit_every`` steps of a window, then every
    ``refit_every`` steps, with every coefficient at least 0 (no feature makes a step
    faster), so a prediction is never below 0.
    """

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        given = self.config.prior
        self._restart(_scaled(given if given is not None else StepTimePrior()))
        self.state = PredictorState.TRUSTED if given is not None else PredictorState.UNCALIBRATED

    def _restart(self, prior: list[float]) -> None:
        """Start a fresh window on ``prior`` (scaled units)."""
        self._prior = prior
        self.coefficients = list(prior)
        self._window: deque[tuple[tuple[float, ...], float]] = deque()
        self._xtx = [[0.0] * 5 for _ in range(5)]
        self._xty = [0.0] * 5
        self._since_fit = 0
        self._ratios: deque[float] = deque(maxlen=RECENT_STEPS)
        self._errors: deque[float] = deque(maxlen=RECENT_STEPS)

    def calibrate(self, prior: StepTimePrior) -> None:
        """Adopt ``prior``, measured on this executor, as the prior, and trust it."""
        self._restart(_scaled(prior))
        self.state = PredictorState.TRUSTED

    @property
    def trusted(self) -> bool:
        return self.state is PredictorState.TRUSTED

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
        predicted = self.predict(features)
        if duration_s > 0 and predicted > 0:
            self._ratios.append(duration_s / predicted)
            self._errors.append(abs(predicted - duration_s) / duration_s)
            if self._check_drift():
                return
        x = _vector(features)
        y = min(duration_s, OUTLIER_FACTOR * max(predicted, 1e-3))
        self._accumulate(x, y, 1.0)
        self._window.append((x, y))
        if len(self._window) > self.config.window:
            old_x, old_y = self._window.popleft()
            self._accumulate(old_x, old_y, -1.0)
        self._since_fit += 1
        early = len(self._window) <= 2 * self.config.refit_every
        if early or self._since_fit >= self.config.refit_every:
            self.refit()

    def _check_drift(self) -> bool:
        """Update the state from the recent steps; on a drift, restart the fit rescaled
        by the recent median ratio and return True."""
        if len(self._ratios) < MIN_TRUST_STEPS // 2:
            return False
        ratio = _median(self._ratios)
        if not 1 / DRIFT_RATIO <= ratio <= DRIFT_RATIO:
            self._restart([c * ratio for c in self.coefficients])
            self.state = PredictorState.DRIFTING
            return True
        if len(self._errors) >= MIN_TRUST_STEPS:
            good = _median(self._errors) <= TRUST_ERROR
            self.state = PredictorState.TRUSTED if good else PredictorState.DRIFTING
        return False

    def _accumulate(self, x: tuple[float, ...], y: float, sign: float) -> None:
        xtx, xty = self._xtx, self._xty
        for i in range(5):
            xi = sign * x[i]
            xty[i] += xi * y
            row = xtx[i]
            for j in range(5):
                row[j] += xi * x[j]

    def refit(self) -> None:
        """Solve the normal equations of the window plus the anchors now: each anchor
        shape, timed by the prior, weighs ``prior_weight / len(ANCHOR_SHAPES)`` steps.

        Pseudo-steps, not a ridge towards the prior's coefficients: a ridge scaled to the
        window's features is weakest on the features the window barely has, so decode
        steps slower than the prior put their excess on every coefficient in equal
        shares, and a 394-token prefill (394x the tokens, ~7,800x the attention pairs of
        a decode) came out 265x too slow. An anchor keeps what the prior says of a
        prefill until prefills are measured."""
        self._since_fit = 0
        weight = self.config.prior_weight / len(ANCHOR_SHAPES)
        a = [row[:] for row in self._xtx]
        b = self._xty[:]
        for shape in ANCHOR_SHAPES:
            x = _vector(shape)
            y = _dot(self._prior, x)
            for i in range(5):
                b[i] += weight * x[i] * y
                for j in range(5):
                    a[i][j] += weight * x[i] * x[j]
        solved = _solve_nonnegative(a, b)
        if solved is not None:
            self.coefficients = solved

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
            self._median = _median(self._errors) if self._errors else None
            self._median_count = self.count
        return self._median
