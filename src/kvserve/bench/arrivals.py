"""When requests are sent: seeded inter-arrival times for an open-loop load.

Gaps are gamma distributed with shape ``burstiness`` and mean ``1 / request_rate`` (the scheme of
vLLM's ``benchmark_serving``). ``burstiness = 1`` gives exponential gaps, i.e. Poisson arrivals;
smaller values make the load burstier (coefficient of variation ``1 / sqrt(burstiness)``), larger
ones more regular. ``request_rate = inf`` sends everything at once (all gaps 0).

    time ──►  |  gap0  |    gap1    | gap2 |   ...      (gap_i ~ Gamma(k=burstiness, θ=1/(rate·k)))
              req0     req1         req2   req3
"""

from __future__ import annotations

import math
from collections.abc import Iterator

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
    if not math.isfinite(burstiness) or burstiness <= 0:
        raise InvalidRequestError(
            f"burstiness must be a finite number > 0 (1 = Poisson), got {burstiness}",
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
    if math.isinf(request_rate):
        while True:
            yield 0.0
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
