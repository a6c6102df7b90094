"""Wall-clock timing shared by the micro-benchmarks in this folder."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_calls(fn: Callable[[], object], repeats: int) -> list[float]:
    """Seconds taken by each of ``repeats`` calls of ``fn``, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times
