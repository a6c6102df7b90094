"""Benchmark arithmetic: per-request latencies to summary statistics, throughput and goodput.

Definitions (as in vLLM's ``benchmark_serving`` and DistServe's goodput, Zhong et al. 2024):

- TTFT: send to first content chunk. E2E latency: send to end of stream.
- TPOT: ``(e2e - ttft) / (output_tokens - 1)``, defined only when ``output_tokens > 1``.
- ITL: every gap between consecutive content chunks, pooled over all requests.
- Throughputs: totals over *completed* requests divided by the benchmark duration (first send to
  last stream end, seconds). Input tokens use the server's ``usage.prompt_tokens`` when reported.
- Goodput: completed requests meeting every given SLO, divided by the duration. A request without
  a TPOT (one output token) has no decode phase and passes a TPOT SLO.
- Peak concurrency: most requests in flight at once, failed ones included.

Percentiles use linear interpolation between order statistics (``numpy.percentile`` default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvserve.bench.stream import RequestFuncOutput
from kvserve.errors import InvalidRequestError

GOODPUT_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class LatencyStats:
    """Summary of one latency metric, all in milliseconds.

    ``percentiles`` maps the percentile (e.g. ``99.0``) to its value. ``count`` is the number of
    samples; with no samples every value is 0.0.
    """

    count: int
    mean: float
    median: float
    std: float
    percentiles: dict[float, float]


@dataclass(frozen=True)
class BenchmarkMetrics:
    """Summary of one benchmark run. Throughputs per second of ``duration_s``."""

    completed: int
    failed: int
    first_error: str
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_token_throughput: float
    peak_concurrency: int
    goodput: float | None
    goodput_slos_ms: dict[str, float]
    output_tokens_from_tokenizer: int
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    itl_ms: LatencyStats
    e2el_ms: LatencyStats


def parse_goodput(items: Sequence[str] | None) -> dict[str, float]:
    """Parse ``["ttft:200", "tpot:50"]`` into ``{"ttft": 200.0, "tpot": 50.0}`` (milliseconds).

    Raises:
        InvalidRequestError: an item is not ``NAME:MS`` with NAME in ttft, tpot, e2el and MS > 0.
    """
    slos: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition(":")
        allowed = ", ".join(GOODPUT_METRICS)
        if not sep or name not in GOODPUT_METRICS:
            raise InvalidRequestError(f"goodput SLO {item!r} must be NAME:MS with NAME one of {allowed}", "goodput")
        try:
            ms = float(value)
        except ValueError:
            raise InvalidRequestError(f"goodput SLO {item!r}: {value!r} is not a number of ms", "goodput") from None
        if not ms > 0:
            raise InvalidRequestError(f"goodput SLO {item!r}: the limit must be > 0 ms", "goodput")
        slos[name] = ms
    return slos


def latency_stats(values_s: Sequence[float], percentiles: Sequence[float]) -> LatencyStats:
    """Statistics of ``values_s`` (seconds), reported in milliseconds."""
    if len(values_s) == 0:
        return LatencyStats(0, 0.0, 0.0, 0.0, {float(p): 0.0 for p in percentiles})
    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    return LatencyStats(
        count=len(ms),
        mean=float(ms.mean()),
        median=float(np.median(ms)),
        std=float(ms.std()),
        percentiles={float(p): float(np.percentile(ms, p)) for p in percentiles},
    )


def request_tpot(out: RequestFuncOutput) -> float | None:
    """TPOT in seconds of one completed request, ``None`` when it produced <= 1 token."""
    if out.output_tokens is None or out.output_tokens <= 1:
        return None
    return (out.latency - out.ttft) / (out.output_tokens - 1)


def peak_concurrency(outputs: Sequence[RequestFuncOutput]) -> int:
    """Most intervals ``[start_time, end_time)`` open at one instant (an end at t frees before a
    start at t)."""
    events = [(o.start_time, 1) for o in outputs] + [(o.end_time, -1) for o in outputs]
    events.sort(key=lambda e: (e[0], e[1]))
    peak = now = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def meets_slos(out: RequestFuncOutput, slos_ms: dict[str, float]) -> bool:
    """Whether a completed request is within every SLO (milliseconds)."""
    values = {"ttft": out.ttft, "e2el": out.latency, "tpot": request_tpot(out)}
    for name, limit in slos_ms.items():
        value = values[name]
        if value is not None and value * 1000.0 > limit:
            return False
    return True


def calculate_metrics(
    outputs: Sequence[RequestFuncOutput],
    duration_s: float,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput_slos_ms: dict[str, float] | None = None,
) -> BenchmarkMetrics:
    """Summarize a run. Every completed output must have ``output_tokens`` set.

    Raises:
        ValueError: ``duration_s`` <= 0 while some request completed.
    """
    done = [o for o in outputs if o.success]
    failed = sorted((o for o in outputs if not o.success), key=lambda o: o.start_time)
    if done and duration_s <= 0:
        raise ValueError(f"benchmark duration must be > 0 s, got {duration_s}")
    assert all(o.output_tokens is not None for o in done), "output_tokens must be filled first"
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    total_in = sum(o.prompt_len for o in done)
    total_out = sum(o.output_tokens for o in done)  # type: ignore[misc]
    slos = dict(goodput_slos_ms or {})
    tpots = [t for t in (request_tpot(o) for o in done) if t is not None]
    return BenchmarkMetrics(
        completed=len(done),
        failed=len(failed),
        first_error=failed[0].error if failed else "",
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=per_s(len(done)),
        input_throughput=per_s(total_in),
        output_throughput=per_s(total_out),
        total_token_throughput=per_s(total_in + total_out),
        peak_concurrency=peak_concurrency(outputs),
        goodput=per_s(sum(meets_slos(o, slos) for o in done)) if slos else None,
        goodput_slos_ms=slos,
        output_tokens_from_tokenizer=sum(o.output_tokens_source == "tokenizer" for o in done),
        ttft_ms=latency_stats([o.ttft for o in done], percentiles),
        tpot_ms=latency_stats(tpots, percentiles),
        itl_ms=latency_stats([gap for o in done for gap in o.itl], percentiles),
        e2el_ms=latency_stats([o.latency for o in done], percentiles),
    )
