"""The report's figures, drawn with matplotlib (Agg) as SVG text to embed in the page:

    throughput_latency  TTFT and TPOT (p50 dashed, p99 solid) against output tokens/s, per engine
    goodput_load        goodput (solid) and completed requests/s (dotted) against load; knee starred
    ttft_cdf            each engine's TTFT distribution at its knee (the lowest level without one)
    itl_cdf             the same for inter-token gaps; dashed lines at the SLO limits

Engines without measured levels are left out of the figures (the tables say why).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from kvserve.bench.compare.stats import RequestRecord, empirical_cdf

PLOTS = ("throughput_latency", "goodput_load", "ttft_cdf", "itl_cdf")
TITLES = {
    "throughput_latency": "Throughput vs latency",
    "goodput_load": "Goodput vs load",
    "ttft_cdf": "TTFT distribution at the knee",
    "itl_cdf": "Inter-token latency distribution at the knee",
}


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _measured(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in data["engines"] if e["levels"]]


def _finish(ax: Any, has_data: bool) -> None:
    """A grid, and the legend, or a note that nothing was measured."""
    ax.grid(alpha=0.3)
    if has_data:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no measured levels", ha="center", va="center", transform=ax.transAxes)


def throughput_latency(data: dict[str, Any]) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    engines = _measured(data)
    for ax, metric, title in ((axes[0], "ttft", "TTFT"), (axes[1], "tpot", "TPOT")):
        for i, engine in enumerate(engines):
            color = f"C{i}"
            x = [lvl["output_throughput"] for lvl in engine["levels"]]
            for pct, style in (("p50", "--"), ("p99", "-")):
                y = [lvl[f"{metric}_{pct}_ms"] if lvl[f"{metric}_{pct}_ms"] is not None else float("nan")
                     for lvl in engine["levels"]]
                ax.plot(x, y, style, marker="o", color=color, label=f"{engine['name']} {pct}")
            for xi, lvl in zip(x, engine["levels"]):
                ax.annotate(lvl["label"], (xi, lvl[f"{metric}_p99_ms"] or 0), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color=color)
        limit = data["slos"].get(metric)
        if limit:
            ax.axhline(limit["limit_ms"], color="grey", linestyle=":", label=f"SLO p{limit['percentile']:g}")
        ax.set(xlabel="output throughput (tok/s)", ylabel=f"{title} (ms)", title=f"{title} vs throughput")
        _finish(ax, bool(engines))
    return _svg(fig)


def goodput_load(data: dict[str, Any]) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    engines = _measured(data)
    for i, engine in enumerate(engines):
        x = [lvl["load"] for lvl in engine["levels"]]
        ax.plot(x, [lvl["goodput"] for lvl in engine["levels"]], "-o", color=f"C{i}", label=f"{engine['name']} goodput")
        ax.plot(x, [lvl["request_throughput"] for lvl in engine["levels"]], ":", color=f"C{i}",
                label=f"{engine['name']} completed")
        if engine["knee"] is not None:
            ax.plot([engine["knee"]["load"]], [engine["knee"]["goodput"]], "*", color=f"C{i}", markersize=16)
    axis = "concurrency (requests in flight)" if data["axis"] == "concurrency" else "offered load (requests/s)"
    ax.set(xlabel=axis, ylabel="requests/s", title="Goodput (requests within every SLO) vs load")
    _finish(ax, bool(engines))
    return _svg(fig)


def _knee_records(engine: dict[str, Any], records: Sequence[Sequence[RequestRecord]]) -> tuple[str, list]:
    index = engine["knee"]["index"] if engine["knee"] is not None else 0
    label = engine["levels"][index]["label"] + ("" if engine["knee"] is not None else ", no knee: lowest level")
    return label, [r for r in records[index] if r.success]


def latency_cdf(data: dict[str, Any], records: dict[str, Sequence[Sequence[RequestRecord]]], metric: str) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    engines = _measured(data)
    for i, engine in enumerate(engines):
        label, done = _knee_records(engine, records[engine["name"]])
        values = [r.ttft_s * 1000 for r in done] if metric == "ttft" else [g * 1000 for r in done for g in r.itl_s]
        if values:
            xs, ys = empirical_cdf(values)
            ax.step(xs, ys, where="post", color=f"C{i}", label=f"{engine['name']} ({label}, n={len(values)})")
    limit = data["slos"].get(metric)
    if limit:
        ax.axvline(limit["limit_ms"], color="grey", linestyle="--", label=f"SLO {limit['limit_ms']:g} ms")
    name = "TTFT" if metric == "ttft" else "inter-token gap"
    ax.set(xlabel=f"{name} (ms)", ylabel="fraction of requests" if metric == "ttft" else "fraction of gaps",
           title=f"{name} CDF at the knee", ylim=(0, 1.02))
    _finish(ax, bool(engines))
    return _svg(fig)


def make_plots(data: dict[str, Any], records: dict[str, Sequence[Sequence[RequestRecord]]]) -> dict[str, str]:
    """Every figure as SVG text, keyed by :data:`PLOTS` names."""
    import matplotlib

    matplotlib.use("Agg")
    return {"throughput_latency": throughput_latency(data), "goodput_load": goodput_load(data),
            "ttft_cdf": latency_cdf(data, records, "ttft"), "itl_cdf": latency_cdf(data, records, "itl")}
