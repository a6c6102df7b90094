"""Result files and console tables.

A result file is JSON: ``{"provenance": {...}, "kind": "serve" | "sweep" | "throughput", ...}``.
:func:`write_result` is the only writer and takes a :class:`Provenance`, so no result can be saved
without its command line, code version, software versions, machine and (online) server.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvserve.bench.metrics import BenchmarkMetrics, LatencyStats
from kvserve.bench.provenance import Provenance
from kvserve.bench.runner import ServeRun

REQUIRED_PROVENANCE = (
    "command", "timestamp", "git_commit", "git_dirty", "kvserve_version", "python_version",
    "torch_version", "cpu_model", "cpu_count",
)


def _jsonable(value: Any) -> Any:
    """Floats that JSON cannot hold (inf, nan) become strings; dict keys become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def metrics_to_dict(metrics: BenchmarkMetrics) -> dict[str, Any]:
    return dataclasses.asdict(metrics)


def serve_run_to_dict(run: ServeRun, detailed: bool = True) -> dict[str, Any]:
    """One online run as JSON-ready data; ``detailed`` adds every request's numbers (seconds)."""
    result: dict[str, Any] = {
        "config": dataclasses.asdict(run.config),
        "model": run.model,
        "num_warmups": run.config.num_warmups,
        "warmup_failed": run.warmup_failed,
        "warmup_first_error": run.warmup_first_error,
        "num_requests": len(run.outputs),
        "num_distinct_prompts": run.num_distinct_prompts,
        "metrics": metrics_to_dict(run.metrics),
    }
    if detailed:
        t0 = min(o.start_time for o in run.outputs)
        result["requests"] = [
            {"success": o.success, "error": o.error, "prompt_len": o.prompt_len,
             "output_tokens": o.output_tokens, "output_tokens_source": o.output_tokens_source,
             "ttft_s": o.ttft, "e2el_s": o.latency, "itl_s": o.itl,
             "start_s": o.start_time - t0}
            for o in run.outputs
        ]
    return result


def write_result(path: str | Path, kind: str, payload: dict[str, Any], provenance: Provenance) -> Path:
    """Write ``payload`` with its provenance to ``path`` (parents created).

    Raises:
        TypeError: ``provenance`` is not a :class:`Provenance`.
        ValueError: a required provenance field is missing (None/empty where it must not be), or
            an online result lacks the server description.
    """
    if not isinstance(provenance, Provenance):
        raise TypeError(f"a result needs a Provenance, got {type(provenance).__name__}")
    prov = provenance.to_dict()
    missing = [k for k in REQUIRED_PROVENANCE if prov.get(k) in (None, "", []) and not _explained(prov, k)]
    if kind in ("serve", "sweep") and prov.get("server") is None:
        missing.append("server")
    if missing:
        raise ValueError(f"refusing to write a result without provenance fields: {', '.join(missing)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"kind": kind, "provenance": prov, **payload}
    path.write_text(json.dumps(_jsonable(document), indent=2) + "\n", encoding="utf-8")
    return path


def _explained(prov: dict[str, Any], key: str) -> bool:
    # A git field may be None only when the reason is recorded; torch may be absent offline-free.
    if key in ("git_commit", "git_dirty"):
        return bool(prov.get("git_error"))
    return False


def _stats_row(name: str, stats: LatencyStats) -> list[str]:
    pcts = "  ".join(f"p{p:g} {v:.2f}" for p, v in stats.percentiles.items())
    return [name, f"{stats.mean:.2f}", f"{stats.median:.2f}", pcts]


def print_serve_table(run: ServeRun, console: Console | None = None) -> None:
    """A compact summary of one online run."""
    m = run.metrics
    console = console or Console(stderr=False)
    table = Table(title=f"kvserve bench serve: {run.model} @ {run.config.base_url}{run.config.endpoint}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("completed / failed", f"{m.completed} / {m.failed}"),
        ("duration (s)", f"{m.duration_s:.2f}"),
        ("input / output tokens", f"{m.total_input_tokens} / {m.total_output_tokens}"),
        ("request throughput (req/s)", f"{m.request_throughput:.2f}"),
        ("input throughput (tok/s)", f"{m.input_throughput:.2f}"),
        ("output throughput (tok/s)", f"{m.output_throughput:.2f}"),
        ("total token throughput (tok/s)", f"{m.total_token_throughput:.2f}"),
        ("peak concurrency", str(m.peak_concurrency)),
    ]
    if m.goodput is not None:
        slos = " ".join(f"{k}<={v:g}ms" for k, v in m.goodput_slos_ms.items())
        rows.append((f"goodput (req/s; {slos})", f"{m.goodput:.2f}"))
    if m.output_tokens_from_tokenizer:
        rows.append(("outputs counted by tokenizer (no usage)", str(m.output_tokens_from_tokenizer)))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    lat = Table(title="latency (ms)")
    for col in ("metric", "mean", "median", "percentiles"):
        lat.add_column(col)
    for name in ("ttft", "tpot", "itl", "e2el"):
        lat.add_row(*_stats_row(name.upper(), getattr(m, f"{name}_ms")))
    console.print(lat)
    if m.failed:
        console.print(f"[red]{m.failed} requests failed; first error: {m.first_error}[/red]")
    if run.num_distinct_prompts < len(run.outputs):
        console.print(f"[yellow]{len(run.outputs)} requests reused {run.num_distinct_prompts} distinct prompts; "
                      "a prefix cache may have served the repeats (raise --num-prompts)[/yellow]")
    if run.warmup_failed:
        console.print(f"[yellow]{run.warmup_failed} warmup requests failed: {run.warmup_first_error}[/yellow]")
