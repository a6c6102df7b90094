"""From the stored cells and probes to the comparison: per engine, each level's numbers and SLO
verdict, the knee, the replicas for the target rate, the probes, the provenance. Then the three
reports: ``compare.json`` (all of it), ``report.md`` (the summary) and ``report.html`` (one
self-contained page with the plots embedded).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kvserve.bench.compare.probes import PROBES
from kvserve.bench.compare.run import tool_repo
from kvserve.bench.compare.spec import CompareSpec, EngineSpec
from kvserve.bench.compare.stats import (
    LevelVerdict,
    RequestRecord,
    evaluate_level,
    find_knee,
    min_requests_for_percentile,
    plan_replicas,
)
from kvserve.bench.compare.store import Store, level_label, level_slug
from kvserve.bench.provenance import collect_provenance
from kvserve.bench.report import _jsonable


def _pct(stats: dict[str, Any], p: float) -> float | None:
    values = stats.get("percentiles", {})
    value = values.get(str(float(p)), values.get(float(p)))
    return None if value is None or not stats.get("count") else float(value)


def level_summary(cell: dict[str, Any], verdict: LevelVerdict) -> dict[str, Any]:
    """The numbers of one level that the tables and plots show (ms and per second)."""
    m = cell["metrics"]
    return {
        "label": cell["label"], "load": cell["load"], "requests": verdict.requests, "completed": verdict.completed,
        "failed": verdict.failed, "first_error": m.get("first_error", ""), "duration_s": m["duration_s"],
        "request_throughput": m["request_throughput"], "output_throughput": m["output_throughput"],
        "goodput": verdict.goodput, "peak_concurrency": m["peak_concurrency"],
        "ttft_p50_ms": _pct(m["ttft_ms"], 50), "ttft_p99_ms": _pct(m["ttft_ms"], 99),
        "tpot_p50_ms": _pct(m["tpot_ms"], 50), "tpot_p99_ms": _pct(m["tpot_ms"], 99),
        "itl_p99_ms": _pct(m["itl_ms"], 99), "e2el_p99_ms": _pct(m["e2el_ms"], 99),
        "meets_slos": verdict.meets_slos, "slos": [dataclasses.asdict(s) for s in verdict.slos],
        "short_percentiles": [{"percentile": p, "needed": n} for p, n in verdict.short_percentiles],
        "output_tokens_from_tokenizer": m.get("output_tokens_from_tokenizer", 0),
    }


def _short_note(engine: str, level: dict[str, Any]) -> str | None:
    if not level["short_percentiles"]:
        return None
    parts = ", ".join(f"p{s['percentile']:g} needs >= {s['needed']}" for s in level["short_percentiles"])
    return (f"{engine} {level['label']}: {level['completed']} completed requests are too few to estimate "
            f"{parts} (a 95% distribution-free upper bound); those percentiles are indicative only")


def analyse_engine(spec: CompareSpec, store: Store, engine: EngineSpec) -> dict[str, Any]:
    """One engine's part of ``compare.json``; ``records`` (per level, for the plots) is kept under
    ``_records`` and dropped before writing."""
    info = store.read(store.engine_path(engine.name)) or {"name": engine.name}
    slos = {m: (s.limit_ms, s.percentile) for m, s in spec.slos.items().items()}
    levels, records, notes = [], [], []
    for i, load in enumerate(spec.load.levels):
        cell = store.read(store.cell_path(engine.name, level_slug(spec.load.axis, load)))
        if cell is None or cell.get("key") != Store.cell_key(spec, engine, i):
            continue
        recs = [RequestRecord.from_dict(r) for r in cell.get("requests", [])]
        verdict = evaluate_level(recs, cell["metrics"]["duration_s"], slos, load)
        level = level_summary(cell, verdict)
        levels.append(level)
        records.append(recs)
        notes.append(_short_note(engine.name, level))
    verdicts_met = [lvl["meets_slos"] for lvl in levels]
    knee = find_knee(verdicts_met) if len(levels) == len(spec.load.levels) else None
    partial = len(levels) != len(spec.load.levels)
    capacity = None
    if spec.capacity is not None:
        goodput = levels[knee]["goodput"] if knee is not None else None
        plan = plan_replicas(spec.capacity.target_request_rate, goodput, spec.capacity.headroom,
                             spec.capacity.max_replicas)
        capacity = dataclasses.asdict(plan)
        if partial:
            why = info.get("skipped") or info.get("error")
            capacity["arithmetic"] = (f"engine not measured ({why[:120]})" if why and not levels
                                      else "not every load level was measured: capacity unknown")
    probes = {}
    for name in PROBES:
        data = store.read(store.probe_path(engine.name, name))
        if data is not None and data.get("key") == Store.probe_key(spec, engine, name):
            probes[name] = {k: v for k, v in data.items() if k != "key"}
    status = "skipped" if "skipped" in info else "error" if "error" in info else "partial" if partial else "measured"
    return {"name": engine.name, "status": status, "info": info, "levels": levels,
            "knee": None if knee is None else {"index": knee, "label": levels[knee]["label"],
                                               "load": levels[knee]["load"], "goodput": levels[knee]["goodput"]},
            "capacity": capacity, "probes": probes, "notes": [n for n in notes if n], "_records": records}


def analyse(spec: CompareSpec, store: Store, engines: list[EngineSpec]) -> dict[str, Any]:
    """The whole comparison as JSON-ready data (per-request records under ``_records``)."""
    return {
        "kind": "compare",
        "name": spec.name, "description": spec.description, "hardware": spec.hardware,
        "spec": spec.model_dump(mode="json"),
        "axis": spec.load.axis,
        "levels": [level_label(spec.load.axis, x) for x in spec.load.levels],
        "slos": {m: {"limit_ms": s.limit_ms, "percentile": s.percentile} for m, s in spec.slos.items().items()},
        "tail_rule": {p: min_requests_for_percentile(p) for p in (50.0, 90.0, 99.0)},
        "provenance": collect_provenance(None, tool_repo()).to_dict(),
        "engines": [analyse_engine(spec, store, e) for e in engines],
    }


def write_reports(spec: CompareSpec, store: Store, engines: list[EngineSpec]) -> list[Path]:
    """``compare.json``, ``report.md`` and ``report.html`` in the output folder; returns the paths
    written (the HTML report, whose figures need matplotlib, is skipped with a line without it)."""
    from kvserve.bench.compare.markdown import render_markdown

    data = analyse(spec, store, engines)
    records = {e["name"]: e.pop("_records") for e in data["engines"]}
    data = _jsonable(data)
    paths = [store.root / "compare.json", store.root / "report.md"]
    paths[0].write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(render_markdown(data), encoding="utf-8")
    try:
        from kvserve.bench.compare.html_report import render_html
        from kvserve.bench.compare.plots import make_plots

        plots = make_plots(data, records)
    except ImportError as exc:
        print(f"report.html skipped: {exc} (pip install matplotlib, or 'kvserve[bench]')", flush=True)
        return paths
    paths.append(store.root / "report.html")
    paths[2].write_text(render_html(data, plots), encoding="utf-8")
    return paths
