"""When requests are sent: seeded inter-arrival times for an open-loop load.

Gaps are gamma distributed with shape ``burstiness`` and mean ``1 / request_rate`` (the scheme of
vLLM's ``benchmark_serving``). ``burstiness = 1`` gives exponential gaps, i.e. Poisson arrivals;
smaller values make the load burstier (coefficient of variation ``1 / sqrt(burstiness)``), larger
ones more regular; ``burstiness = inf`` gives constant gaps ``1 / request_rate``.
``request_rate = inf`` sends everything at once (all gaps 0).

For a fixed number of requests, :func:`arrival_schedule` does what vLLM's ``get_request`` does:
the cumulative offsets are rescaled so the last one is exactly ``count / request_rate`` (the sum of
random gaps is otherwise off by a few percent, which moves throughput between seeds), and a
ramp-up raises the rate from request to request (linearly or exponentially) instead.

    time ──►  |  gap0  |    gap1    | gap2 |   ...      (gap_i ~ Gamma(k=burstiness, θ=1/(rate·k)))
              req0     req1         req2   req3
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvserve.errors import InvalidRequestError


def validate_arrival_args(request_rate: float, burstiness: float) -> None:
    """Check an arrival process's parameters.

    Raises:
        InvalidRequestError: ``request_rate`` is not > 0 (``inf`` is allowed) or ``burstiness``
            is not a finite number > 0.
    """
    if math.isnan(request_rate) or request_rate <= 0:
        raise InvalidRequestError(
            f"request rate must be > 0 requests/s or inf (all at once), got {request_rate}",
            param="request_rate",
        )
    if math.isnan(burstiness) or burstiness <= 0:
        raise InvalidRequestError(
            f"burstiness must be > 0 (1 = Poisson, inf = constant gaps), got {burstiness}",
            param="burstiness",
        )


def arrival_gaps(request_rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """Endless seeded stream of gaps (seconds) to wait before each request.

    The first request also waits one gap, as in vLLM. The stream depends only on
    ``(request_rate, burstiness, seed)``, so two runs with the same arguments send at the same
    offsets.

    Args:
        request_rate: mean requests per second, or ``math.inf`` for no waiting at all.
        burstiness: gamma shape ``k`` (> 0); 1 = Poisson arrivals.
        seed: seed of a private ``numpy.random.Generator`` (PCG64).

    Raises:
        InvalidRequestError: see :func:`validate_arrival_args`.
    """
    validate_arrival_args(request_rate, burstiness)
    if math.isinf(request_rate) or math.isinf(burstiness):
        while True:
            yield 0.0 if math.isinf(request_rate) else 1.0 / request_rate
    rng = np.random.default_rng(seed)
    scale = 1.0 / (request_rate * burstiness)
    while True:
        # Draw in blocks: one numpy call per 256 requests instead of one per request.
        for gap in rng.gamma(shape=burstiness, scale=scale, size=256):
            yield float(gap)


def arrival_offsets(request_rate: float, burstiness: float, seed: int, count: int) -> list[float]:
    """The first ``count`` send times (seconds from the benchmark start), cumulative gaps.

    Raises:
        InvalidRequestError: see :func:`validate_arrival_args`; ``count`` < 0.
    """
    if count < 0:
        raise InvalidRequestError(f"count must be >= 0, got {count}", param="count")
    gaps = arrival_gaps(request_rate, burstiness, seed)
    offsets, now = [], 0.0
    for _ in range(count):
        now += next(gaps)
        offsets.append(now)
    return offsets


@dataclass(frozen=True)
class RampUp:
    """vLLM's ``--ramp-up-strategy`` (``linear`` or ``exponential``) from ``start_rps`` to
    ``end_rps`` over the requests of a run: request ``i`` of ``n`` gets the rate at progress
    ``i / (n - 1)``."""

    strategy: str
    start_rps: int
    end_rps: int

    def rate(self, index: int, count: int) -> float:
        progress = index / max(count - 1, 1)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * progress
        return self.start_rps * (self.end_rps / self.start_rps) ** progress

    def validate(self, request_rate: float) -> None:
        """Raises: InvalidRequestError: vLLM's checks of the ramp-up flags."""
        if not math.isinf(request_rate):
            raise InvalidRequestError("with --ramp-up-strategy the ramp sets the rate: drop --request-rate",
                                      "request_rate")
        if self.start_rps < 0 or self.end_rps < 0 or self.start_rps > self.end_rps:
            raise InvalidRequestError(f"ramp-up rates must satisfy 0 <= start <= end, got {self.start_rps} "
                                      f"and {self.end_rps}", "ramp_up_start_rps")
        if self.strategy == "exponential" and self.start_rps == 0:
            raise InvalidRequestError("an exponential ramp-up cannot start at 0 requests/s", "ramp_up_start_rps")


def arrival_schedule(count: int, request_rate: float, burstiness: float, seed: int,
                     ramp_up: RampUp | None = None) -> tuple[list[float], list[float]]:
    """Send offsets (seconds from the start, cumulative) and the rate each request was drawn at,
    for ``count`` requests, as vLLM's ``get_request``.

    Raises:
        InvalidRequestError: see :func:`validate_arrival_args`; a ramp-up rate of 0.
    """
    validate_arrival_args(request_rate, burstiness)
    rng = np.random.default_rng(seed)
    rates = [ramp_up.rate(i, count) if ramp_up else request_rate for i in range(count)]
    offsets, now = [], 0.0
    for rate in rates:
        if not rate > 0:
            raise InvalidRequestError(f"the ramp-up gives a rate of {rate} requests/s", "ramp_up_start_rps")
        if math.isinf(rate):
            gap = 0.0
        elif math.isinf(burstiness):
            gap = 1.0 / rate
        else:
            gap = float(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)))
        now += gap
        offsets.append(now)
    if ramp_up is None and offsets and offsets[-1] != 0:
        scale = (count / request_rate) / offsets[-1]
        offsets = [t * scale for t in offsets]
    return offsets, rates
