"""What every baseline shares with ``kvserve bench serve``: the workload, the summary and the
result file.

Workload: exactly the prompts ``kvserve bench serve --dataset-name random --input-len N
--output-len M --num-prompts K --seed S`` sends (:class:`kvserve.bench.datasets.RandomDataset`
drawn with ``numpy.random.default_rng(S)``), as token ids, so a baseline and kvserve see the same
tokens. Outputs are forced to exactly M tokens (ignore_eos).

Summary: the same definitions as :mod:`kvserve.bench.metrics` (TTFT, E2E latency, TPOT =
(E2E - TTFT) / (M - 1), output throughput = output tokens / wall duration), computed by
:func:`kvserve.bench.metrics.latency_stats`.

Result file: written by :func:`kvserve.bench.report.write_result`, so it carries the same
provenance as a ``kvserve bench`` result (command line, timestamp, git commit and dirty flag,
kvserve/python/torch versions, CPU model and count), plus the baseline's own library versions.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvserve.bench.datasets import RandomDataset, SampleRequest
from kvserve.bench.metrics import latency_stats
from kvserve.bench.prompts import load_tokenizer
from kvserve.bench.provenance import collect_provenance
from kvserve.bench.report import write_result

PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class RequestTiming:
    """One request's timing in seconds from its own start (static batches: the batch's start)."""

    ttft_s: float
    e2el_s: float
    output_tokens: int


def load_workload(tokenizer_dir: str, num_prompts: int, input_len: int, output_len: int,
                  seed: int) -> list[SampleRequest]:
    """The random workload ``kvserve bench serve`` draws for the same flags.

    Raises:
        kvserve.errors.InvalidRequestError: bad lengths or an unloadable tokenizer folder.
    """
    tokenizer = load_tokenizer(tokenizer_dir)
    return RandomDataset(input_len, output_len).sample(tokenizer, num_prompts, np.random.default_rng(seed))


def summarize(timings: list[RequestTiming], duration_s: float, input_tokens: int) -> dict[str, Any]:
    """Throughputs (tokens/s over ``duration_s`` seconds of wall time) and latency statistics
    (milliseconds), named as in ``kvserve bench``'s ``metrics``."""
    output_tokens = sum(t.output_tokens for t in timings)
    tpots = [(t.e2el_s - t.ttft_s) / (t.output_tokens - 1) for t in timings if t.output_tokens > 1]
    return {
        "completed": len(timings),
        "failed": 0,
        "duration_s": duration_s,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(timings) / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s,
        "ttft_ms": dataclasses.asdict(latency_stats([t.ttft_s for t in timings], PERCENTILES)),
        "tpot_ms": dataclasses.asdict(latency_stats(tpots, PERCENTILES)),
        "e2el_ms": dataclasses.asdict(latency_stats([t.e2el_s for t in timings], PERCENTILES)),
    }


def package_versions(*names: str) -> dict[str, str]:
    """Installed versions of ``names`` ('' when a package is absent)."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = ""
    return versions


def write_baseline(path: str | Path, baseline: str, settings: dict[str, Any], workload: dict[str, Any],
                   metrics: dict[str, Any], versions: dict[str, str]) -> Path:
    """Write ``{"kind": "baseline", "provenance": ..., "baseline": ..., ...}`` to ``path``.

    Raises:
        ValueError: a provenance field could not be collected (see ``write_result``).
    """
    payload = {"baseline": baseline, "settings": settings, "workload": workload,
               "versions": versions, "metrics": metrics}
    return write_result(path, "baseline", payload, collect_provenance(None))


def print_summary(title: str, metrics: dict[str, Any]) -> None:
    """One line per figure, for the console."""
    print(f"== {title}")
    print(f"   requests {metrics['completed']}, duration {metrics['duration_s']:.2f} s, "
          f"output {metrics['output_throughput']:.2f} tok/s, total {metrics['total_token_throughput']:.2f} tok/s")
    for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
        s = metrics[name]
        print(f"   {name[:-3].upper():5s} mean {s['mean']:.1f} ms, median {s['median']:.1f} ms, "
              f"p99 {s['percentiles'][99.0]:.1f} ms")
