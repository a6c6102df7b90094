"""Result files and console notes.

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

from kvserve.bench.metrics import BenchmarkMetrics
from kvserve.bench.provenance import Provenance
from kvserve.bench.runner import ServeRun

REDACTED = "<redacted>"
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
    config = dataclasses.asdict(run.config)
    config["headers"] = {key: REDACTED for key in config["headers"]}  # API keys stay out of files
    result: dict[str, Any] = {
        "config": config,
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


def write_result(path: str | Path, kind: str, payload: dict[str, Any], provenance: Provenance,
                 append: bool = False) -> Path:
    """Write ``payload`` with its provenance to ``path`` (parents created); ``append`` adds it as
    one JSON line after what the file holds (vLLM's ``--append-result``).

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
    document = _jsonable({"kind": kind, "provenance": prov, **payload})
    if append:
        with path.open("a+", encoding="utf-8") as f:
            if f.tell() != 0:
                f.write("\n")
            f.write(json.dumps(document))
    else:
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def _explained(prov: dict[str, Any], key: str) -> bool:
    # A git field may be None only when the reason is recorded; torch may be absent offline-free.
    if key in ("git_commit", "git_dirty"):
        return bool(prov.get("git_error"))
    return False


def print_notes(run: ServeRun, console: Console | None = None) -> None:
    """What the summary does not say: failed requests (vLLM's first ten errors), prompts reused by
    a ``--duration`` run, failed warmups."""
    console = console or Console(stderr=False, highlight=False)
    failed = [o for o in run.outputs if not o.success]
    if failed:  # plain print: error bodies are not re-wrapped to the terminal's width
        print("Failed requests during benchmark run detected (capping to 10):")
        for i, out in enumerate(failed[:10]):
            print(f"Error {i}: {out.error}")
    if run.num_distinct_prompts < len(run.outputs):
        console.print(f"[yellow]{len(run.outputs)} requests reused {run.num_distinct_prompts} distinct prompts; "
                      "a prefix cache may have served the repeats (raise --num-prompts)[/yellow]")
    if run.warmup_failed:
        console.print(f"[yellow]{run.warmup_failed} warmup requests failed: {run.warmup_first_error}[/yellow]",
                      markup=False)
