"""Load sweeps: the same workload at several concurrencies and/or request rates, to find the knee
where more load stops buying throughput and only adds latency.

Each point is a full :func:`kvserve.bench.runner.run_serve`. The plot puts output throughput
(tok/s) on x and latency (ms) on y, one panel for TTFT and one for TPOT, p50 and p99 lines, each
point labelled with its load::

    TTFT ms |            p99 *            TPOT ms |           p99 *
            |        *  /                         |       * ./
            |  *  *  p50 *                        | * * * p50 *
            +-------------------- tok/s           +----------------- tok/s
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from kvserve.bench.datasets import SampleRequest
from kvserve.bench.runner import ServeConfig, ServeRun, run_serve
from kvserve.errors import InvalidRequestError


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One load level: ``max_concurrency`` (None = uncapped) and ``request_rate`` (req/s)."""

    max_concurrency: int | None
    request_rate: float

    @property
    def label(self) -> str:
        parts = []
        if self.max_concurrency is not None:
            parts.append(f"c={self.max_concurrency}")
        if not math.isinf(self.request_rate) or not parts:
            parts.append(f"rate={self.request_rate:g}")
        return " ".join(parts)


def sweep_points(concurrencies: Sequence[int], request_rates: Sequence[float]) -> list[SweepPoint]:
    """The cross product of the given levels (an empty list stands for "no limit").

    Raises:
        InvalidRequestError: a concurrency < 1 or a rate <= 0, or neither list given.
    """
    if not concurrencies and not request_rates:
        raise InvalidRequestError("a sweep needs --concurrency and/or --request-rates lists", "concurrency")
    if any(c < 1 for c in concurrencies):
        raise InvalidRequestError(f"concurrency levels must be >= 1, got {list(concurrencies)}", "concurrency")
    if any(not r > 0 for r in request_rates):
        raise InvalidRequestError(f"request rates must be > 0 (or inf), got {list(request_rates)}", "request_rates")
    return [SweepPoint(c, r) for r in (request_rates or [math.inf]) for c in (concurrencies or [None])]


async def run_sweep(base: ServeConfig, points: Sequence[SweepPoint],
                    sample_sets: Sequence[Sequence[SampleRequest]], tokenizer: Any,
                    warmup_samples: Sequence[SampleRequest] | None = None) -> list[ServeRun]:
    """Run ``base`` once per point (in order, each with its own warmups), with a progress bar
    over points. ``sample_sets[i]`` is the workload of point ``i``: give each point fresh prompts,
    or a server's prefix cache serves later points from blocks cached by earlier ones.

    Raises:
        ValueError: not one sample set per point.
    """
    if len(sample_sets) != len(points):
        raise ValueError(f"{len(sample_sets)} sample sets for {len(points)} sweep points")
    runs = []
    for point, samples in zip(tqdm(points, desc="sweep", disable=base.disable_tqdm), sample_sets):
        config = dataclasses.replace(base, max_concurrency=point.max_concurrency, request_rate=point.request_rate)
        runs.append(await run_serve(config, samples, tokenizer, warmup_samples))
    return runs


def plot_sweep(runs: Sequence[ServeRun], points: Sequence[SweepPoint], path: str | Path) -> Path:
    """Write the throughput-latency PNG to ``path`` (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r.metrics.output_throughput for r in runs]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for pct, style in ((50.0, "o-"), (99.0, "s--")):
            y = [getattr(r.metrics, metric).percentiles.get(pct, float("nan")) for r in runs]
            ax.plot(x, y, style, label=f"p{pct:g}")
            if pct == 50.0:
                for xi, yi, point in zip(x, y, points):
                    ax.annotate(point.label, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(f"{title} vs throughput")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"kvserve bench sweep: {runs[0].model}" if runs else "kvserve bench sweep")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_sweep_table(runs: Sequence[ServeRun], points: Sequence[SweepPoint], rooflines: Sequence[Any] | None = None,
                      console: Console | None = None) -> None:
    """One row per load level: throughput, its fraction of the roofline bound
    (``kvserve.bench.roofline_report.RooflineResult``, '-' without one), TTFT/TPOT p50/p99 (ms),
    failures."""
    table = Table(title="kvserve bench sweep")
    for col in ("load", "req/s", "out tok/s", "roofline", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
                "peak conc", "failed"):
        table.add_column(col, justify="right")
    fractions = [None if r is None else r.fraction for r in (rooflines or [None] * len(runs))]
    for run, point, fraction in zip(runs, points, fractions):
        m = run.metrics
        table.add_row(
            point.label, f"{m.request_throughput:.2f}", f"{m.output_throughput:.1f}",
            "-" if fraction is None else f"{fraction:.2f}",
            f"{m.ttft_ms.percentiles.get(50.0, m.ttft_ms.median):.1f}", f"{m.ttft_ms.percentiles.get(99.0, 0.0):.1f}",
            f"{m.tpot_ms.percentiles.get(50.0, m.tpot_ms.median):.1f}", f"{m.tpot_ms.percentiles.get(99.0, 0.0):.1f}",
            str(m.peak_concurrency), str(m.failed),
        )
    (console or Console()).print(table)
