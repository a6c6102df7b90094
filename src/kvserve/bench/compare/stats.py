"""The selection arithmetic: SLO attainment, goodput, the knee, replicas, and whether a level had
enough requests for the percentile it reports. Pure functions of per-request records, so every
value can be checked against scripted latencies.

Definitions (DistServe's goodput and SLO attainment, Zhong et al., OSDI 2024):

- A request's SLO values (ms): ``ttft``; ``tpot`` = (E2E - TTFT) / (output tokens - 1), none for
  one output token; ``itl`` = its longest gap between two content chunks, none without a gap;
  ``e2el``. A missing value is within any limit (there was no such phase).
- Attainment of one SLO = requests completed within its limit / requests sent (failed requests
  are misses). A level **meets the SLOs** when, for every SLO, attainment >= percentile / 100.
- Goodput = requests completed within every limit / the level's duration (requests/s).
- The **knee** is the highest load level that meets the SLOs, walking up the levels and stopping
  at the first that does not (a pass above a failure is noise, not capacity).
- Replicas for a target rate R with ``headroom`` h at a knee goodput g: ``ceil(R / (g * h))``.
- A percentile p of n values is *estimable* when the largest of them is a one-sided 95%
  distribution-free upper confidence bound of it: 1 - (p/100)^n >= 0.95, i.e.
  n >= ln(0.05) / ln(p/100) (p99 needs 299 requests, p90 29, p50 5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TAIL_CONFIDENCE = 0.95


@dataclass(frozen=True)
class RequestRecord:
    """One request as measured: seconds, like ``RequestFuncOutput``."""

    success: bool
    ttft_s: float = 0.0
    e2el_s: float = 0.0
    itl_s: tuple[float, ...] = ()
    output_tokens: int | None = None
    error: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        """From a result file's ``requests`` entry (``kvserve.bench.report.serve_run_to_dict``)."""
        return cls(bool(data["success"]), float(data.get("ttft_s") or 0.0), float(data.get("e2el_s") or 0.0),
                   tuple(float(x) for x in data.get("itl_s") or ()), data.get("output_tokens"),
                   data.get("error") or "")


def slo_values_ms(record: RequestRecord) -> dict[str, float | None]:
    """A completed request's SLO values in ms (see the module docstring)."""
    tpot = None
    if record.output_tokens is not None and record.output_tokens > 1:
        tpot = (record.e2el_s - record.ttft_s) / (record.output_tokens - 1) * 1000.0
    return {"ttft": record.ttft_s * 1000.0, "tpot": tpot,
            "itl": max(record.itl_s) * 1000.0 if record.itl_s else None, "e2el": record.e2el_s * 1000.0}


@dataclass(frozen=True)
class SLOResult:
    """One SLO at one level: ``attainment`` (0-1) against ``required`` (percentile / 100), and the
    metric's value at that percentile over completed requests (``value_ms``; NaN with none)."""

    metric: str
    limit_ms: float
    percentile: float
    attainment: float
    required: float
    value_ms: float
    met: bool


@dataclass(frozen=True)
class LevelVerdict:
    """One load level judged against the SLOs."""

    load: float
    requests: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    goodput: float
    slos: tuple[SLOResult, ...]
    meets_slos: bool
    short_percentiles: tuple[tuple[float, int], ...]  # (percentile, requests needed) not estimable here


def min_requests_for_percentile(percentile: float, confidence: float = TAIL_CONFIDENCE) -> int:
    """Fewest values whose maximum is a one-sided ``confidence`` upper bound of the percentile.

    Raises:
        ValueError: ``percentile`` not in (0, 100) or ``confidence`` not in (0, 1).
    """
    if not 0 < percentile < 100 or not 0 < confidence < 1:
        raise ValueError(f"need 0 < percentile < 100 and 0 < confidence < 1, got {percentile}, {confidence}")
    n = math.ceil(math.log(1 - confidence) / math.log(percentile / 100.0))
    while 1 - (percentile / 100.0) ** (n - 1) >= confidence:  # guard against rounding up past the bound
        n -= 1
    return n


def _percentile(values: Sequence[float], percentile: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), percentile)) if values else float("nan")


def evaluate_level(records: Sequence[RequestRecord], duration_s: float, slos: Mapping[str, tuple[float, float]],
                   load: float = 0.0, reported_percentiles: Sequence[float] = (99.0,)) -> LevelVerdict:
    """Judge one level. ``slos`` maps a metric (ttft, tpot, itl, e2el) to ``(limit_ms, percentile)``;
    ``duration_s`` is the level's first send to last stream end. ``short_percentiles`` lists the SLO
    percentiles and ``reported_percentiles`` that the completed requests are too few to estimate.

    Raises:
        ValueError: an unknown metric, or ``duration_s`` <= 0 while a request completed.
    """
    done = [r for r in records if r.success]
    if done and duration_s <= 0:
        raise ValueError(f"a level with completed requests needs a duration > 0 s, got {duration_s}")
    values = [slo_values_ms(r) for r in done]
    results, good = [], [True] * len(done)
    for metric, (limit, pct) in slos.items():
        if metric not in ("ttft", "tpot", "itl", "e2el"):
            raise ValueError(f"unknown SLO metric {metric!r}")
        within = [v[metric] is None or v[metric] <= limit for v in values]
        good = [g and w for g, w in zip(good, within)]
        attainment = sum(within) / len(records) if records else 0.0
        measured = [v[metric] for v in values if v[metric] is not None]
        results.append(SLOResult(metric, limit, pct, attainment, pct / 100.0, _percentile(measured, pct),
                                 bool(records) and attainment >= pct / 100.0))
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    wanted = sorted({*reported_percentiles, *(pct for _, pct in slos.values())})
    short = tuple((p, need) for p in wanted if len(done) < (need := min_requests_for_percentile(p)))
    return LevelVerdict(load, len(records), len(done), len(records) - len(done), duration_s, per_s(len(done)),
                        per_s(sum(good)), tuple(results), bool(results) and all(r.met for r in results), short)


def find_knee(meets_slos: Sequence[bool]) -> int | None:
    """Index of the highest level meeting the SLOs before the first that does not (levels in
    increasing load, one verdict each); None when the lowest level already misses."""
    knee = None
    for i, met in enumerate(meets_slos):
        if not met:
            break
        knee = i
    return knee


@dataclass(frozen=True)
class ReplicaPlan:
    """Replicas for a target rate, with the arithmetic as text."""

    target_request_rate: float
    per_replica_goodput: float
    headroom: float
    replicas: int | None
    within_budget: bool | None
    arithmetic: str


def plan_replicas(target_rps: float, knee_goodput: float | None, headroom: float = 1.0,
                  max_replicas: int | None = None) -> ReplicaPlan:
    """``ceil(target / (goodput * headroom))`` replicas, or None without a usable knee.

    Raises:
        ValueError: ``target_rps`` <= 0 or ``headroom`` not in (0, 1].
    """
    if not target_rps > 0 or not 0 < headroom <= 1:
        raise ValueError(f"need target > 0 and 0 < headroom <= 1, got {target_rps}, {headroom}")
    if knee_goodput is None or knee_goodput <= 0:
        why = "no load level met the SLOs" if knee_goodput is None else "the knee's goodput is 0 requests/s"
        return ReplicaPlan(target_rps, knee_goodput or 0.0, headroom, None, None, f"{why}: capacity unknown")
    usable = knee_goodput * headroom
    ratio = target_rps / usable
    count = math.ceil(ratio - 1e-9)  # 12.000000000001 from float division is 12 replicas
    arithmetic = (f"ceil({target_rps:g} req/s / ({knee_goodput:.3f} req/s x {headroom:g})) = "
                  f"ceil({ratio:.3f}) = {count}")
    within = None if max_replicas is None else count <= max_replicas
    if max_replicas is not None:
        arithmetic += f" ({'within' if within else 'over'} the budget of {max_replicas})"
    return ReplicaPlan(target_rps, knee_goodput, headroom, count, within, arithmetic)


def empirical_cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """``(sorted values, fraction <= each)``: the step points of the empirical CDF."""
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]
