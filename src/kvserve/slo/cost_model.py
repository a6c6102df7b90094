"""The time of an engine step as a function of its work, learned online from the engine's own steps.

    step seconds = c0 + c1 * prefill tokens + c2 * decode rows + c3 * attention pairs / 1e6

``attention pairs`` is the sum over the step's requests of its new tokens times the context each
attends to (``n * (computed + n / 2)``): a decode row of context L adds L, a prefill chunk of n
tokens after c cached ones adds ``n * (c + n / 2)``. ``c0`` is what every step pays (reading the
weights once, the step's fixed overheads); ``c1`` the compute of a prompt token; ``c2`` a decode
row's; ``c3`` attention's. The fit is a least-squares fit over the last ``window`` steps (of this
model, on this machine, with whatever else the host runs), refreshed every ``refit_every``
observations, with no coefficient below zero (a negative one is dropped and the rest refitted).

Until ``min_observations`` steps of both kinds (with prefill, decode only) have been seen the
model says it is not ready, and callers admit and schedule as without targets.

``margin`` is the share of a latency target that plans may fill: the inverse of the 90th
percentile of actual / predicted step time over the window (each step compared with the fit made
before it), within ``MARGIN_BOUNDS``; ``DEFAULT_MARGIN`` until ``min_observations`` steps have been
compared. A noisy host plans with more room, a steady one with less.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

TERMS = ("step", "prefill_token", "decode_row", "attention_mpair")
DEFAULT_MARGIN = 0.75
MARGIN_BOUNDS = (0.4, 0.8)
MARGIN_QUANTILE = 0.9


@dataclass(frozen=True)
class StepWork:
    """What one step computes (the cost model's features)."""

    prefill_tokens: int
    decode_rows: int
    attention_pairs: float

    def features(self) -> tuple[float, float, float, float]:
        return 1.0, float(self.prefill_tokens), float(self.decode_rows), self.attention_pairs / 1e6


class StepCostModel:
    """Step time predicted from ``StepWork`` (see the module docstring).

    Args:
        window: steps kept for the fit.
        refit_every: observations between fits.
        min_observations: steps of each kind (with prefill; decode only) before the model is ready.
    """

    def __init__(self, window: int = 512, refit_every: int = 8, min_observations: int = 8):
        self._rows: deque[tuple[float, float, float, float]] = deque(maxlen=window)
        self._seconds: deque[float] = deque(maxlen=window)
        self._ratios: deque[float] = deque(maxlen=window)  # actual / predicted, by the fit before
        self._refit_every = refit_every
        self._min_observations = min_observations
        self._since_fit = 0
        self._seen_prefill = 0
        self._seen_decode = 0
        self.coefficients = np.zeros(len(TERMS))
        self.observations = 0
        self.margin = DEFAULT_MARGIN

    @property
    def ready(self) -> bool:
        return self._seen_prefill >= self._min_observations and self._seen_decode >= self._min_observations \
            and bool(self.coefficients.any())

    def observe(self, work: StepWork, seconds: float) -> None:
        """Record one step's work and its measured duration."""
        predicted = self.predict(work)
        if predicted > 0:
            self._ratios.append(seconds / predicted)
        self._rows.append(work.features())
        self._seconds.append(seconds)
        self.observations += 1
        if work.prefill_tokens:
            self._seen_prefill += 1
        elif work.decode_rows:
            self._seen_decode += 1
        self._since_fit += 1
        if self._since_fit >= self._refit_every:
            self.fit()

    def fit(self) -> None:
        """Refit the coefficients on the window (non-negative least squares by elimination)."""
        self._since_fit = 0
        if len(self._rows) < len(TERMS):
            return
        x, y = np.asarray(self._rows), np.asarray(self._seconds)
        active = list(range(len(TERMS)))
        coefficients = np.zeros(len(TERMS))
        while active:
            solution, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
            if (solution >= 0).all():
                coefficients[active] = solution
                break
            active.pop(int(np.argmin(solution)))
        self.coefficients = coefficients
        if len(self._ratios) >= max(1, self._min_observations):
            low, high = MARGIN_BOUNDS
            self.margin = min(high, max(low, 1 / float(np.quantile(self._ratios, MARGIN_QUANTILE))))

    def predict(self, work: StepWork) -> float:
        """Seconds the step is expected to take (0 before the first fit)."""
        return float(np.dot(self.coefficients, work.features()))

    def prefill_tokens_within(self, seconds: float, decode_rows: int, attention_pairs: float,
                              prefill_context: int = 0) -> int:
        """The most prompt tokens x a step with these decode rows can add and still take at most
        ``seconds``, the chunk attending to ``prefill_context`` computed tokens before it (its
        pairs ``x * (prefill_context + x / 2)``); 0 when even the decodes alone take longer."""
        spare = seconds - self.predict(StepWork(0, decode_rows, attention_pairs))
        if spare <= 0:
            return 0
        a = self.coefficients[3] / 2e6  # a x^2 + b x <= spare
        b = self.coefficients[1] + self.coefficients[3] * prefill_context / 1e6
        if a == 0:
            return int(spare / b) if b > 0 else 1 << 30
        return int((-b + (b * b + 4 * a * spare) ** 0.5) / (2 * a))

    def rows_within(self, seconds: float, context: float) -> int:
        """The most decode rows of ``context`` computed tokens each a decode-only step may have and
        still take at most ``seconds``."""
        per_row = self.coefficients[2] + self.coefficients[3] * (context + 0.5) / 1e6
        spare = seconds - self.coefficients[0]
        if spare <= 0:
            return 0
        return int(spare / per_row) if per_row > 0 else 1 << 30

    def describe(self) -> dict:
        """The fit, for ``/debug/slo`` and the metrics: seconds per term, observations, readiness,
        the planning margin."""
        return {"coefficients": dict(zip(TERMS, (float(c) for c in self.coefficients))),
                "observations": self.observations, "window": len(self._rows), "ready": self.ready,
                "margin": self.margin}
