"""The scaling signal: ``desired_replicas`` from queue depth, TTFT p90 and KV pressure.

The rule is the Horizontal Pod Autoscaler's own (``desired = ceil(current * metric / target)``)
taken over three metrics, the largest winning::

    N      = active workers that are routable (>= 1)
    r_q    = waiting requests over all active workers / (N * target_queue_per_replica)
    r_ttft = TTFT p90 over the last window_seconds (through the router) / target_ttft_p90
    r_kv   = mean KV-cache usage of the active workers / target_kv_usage
    desired_replicas = clamp(ceil(N * max(r_q, r_ttft, r_kv)), min_replicas, max_replicas)

So with 3 workers, 30 requests waiting and a target of 4 per replica, desired = ceil(3 * 2.5) = 8;
an idle fleet asks for ``min_replicas``. An HPA reads it as an External metric with
``target.averageValue: 1`` (then HPA's replicas = the metric itself, ``deploy/kubernetes``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvserve.router.config import ScalingConfig


class SlidingWindow:
    """Observations of the last ``seconds`` seconds (at most ``max_items``), with percentiles."""

    def __init__(self, seconds: float, max_items: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self._items: deque[tuple[float, float]] = deque(maxlen=max_items)

    def add(self, value: float) -> None:
        self._items.append((self.clock(), value))

    def percentile(self, q: float) -> float | None:
        """The ``q``-quantile (0-1, nearest rank) of the window, or None when empty."""
        oldest = self.clock() - self.seconds
        while self._items and self._items[0][0] < oldest:
            self._items.popleft()
        if not self._items:
            return None
        values = sorted(v for _, v in self._items)
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


@dataclass(frozen=True)
class ScalingInputs:
    """What the rule reads (see the module docstring)."""

    num_replicas: int
    num_waiting: float
    ttft_p90: float | None
    kv_usage: float


def desired_replicas(inputs: ScalingInputs, config: ScalingConfig) -> int:
    """The rule of the module docstring."""
    n = max(1, inputs.num_replicas)
    ratios = [inputs.num_waiting / (n * config.target_queue_per_replica), inputs.kv_usage / config.target_kv_usage]
    if inputs.ttft_p90 is not None:
        ratios.append(inputs.ttft_p90 / config.target_ttft_p90)
    wanted = math.ceil(n * max(ratios) - 1e-9)
    return max(config.min_replicas, min(config.max_replicas, wanted))
