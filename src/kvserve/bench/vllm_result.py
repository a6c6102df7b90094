"""A run in vLLM's result format: the flat JSON keys and the printed summary of ``vllm bench serve``.

Keys and their meanings are those of vLLM's ``vllm/benchmarks/serve.py`` (``benchmark`` and
``main_async``), so scripts that read vLLM's result files read kvserve's::

    date endpoint_type backend label model_id tokenizer_id num_prompts [metadata keys]
    request_rate burstiness max_concurrency [ramp_up_strategy ramp_up_start_rps ramp_up_end_rps]
    duration completed failed total_input_tokens total_output_tokens request_throughput
    request_goodput output_throughput total_token_throughput max_output_tokens_per_s
    max_concurrent_requests rtfx latencies queue_times [rps_change_events]
    mean_/median_/std_/p<P>_ <metric>_ms  for each --percentile-metrics metric and --metric-percentiles P
    with --save-detailed: input_lens output_lens ttfts itls start_times generated_texts errors

Statistics are over completed requests (an empty set gives 0, as ``np.mean(x or 0)``), in ms;
``p99.9`` keeps its decimal. ``max_output_tokens_per_s`` counts streamed chunks per whole second
from the first send; ``max_concurrent_requests`` is the most completed requests open at once.
kvserve's own, richer keys (``kind``, ``provenance``, ``metrics``, ``requests``, ...) sit beside
these in the same file.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvserve.bench.metrics import request_tpot
from kvserve.bench.runner import ServeRun
from kvserve.bench.stream import RequestFuncOutput
from kvserve.errors import InvalidRequestError

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
DETAILED_KEYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors")
_HEADERS = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
            "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency"),
            "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
            "e2el_including_client_queue": ("E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency")}


@dataclass(frozen=True)
class ResultHeader:
    """The run description vLLM puts before the measurements (``main_async``); ``date`` is
    ``%Y%m%d-%H%M%S`` local time, also used in the file name."""

    backend: str
    label: str | None
    model_id: str
    tokenizer_id: str
    num_prompts: int | None
    metadata: dict[str, str]
    date: str = field(default_factory=lambda: dt.datetime.now().strftime("%Y%m%d-%H%M%S"))


def parse_percentile_metrics(text: str | None) -> list[str]:
    """``--percentile-metrics``. Raises: InvalidRequestError: an unknown name."""
    names = (text or DEFAULT_PERCENTILE_METRICS).split(",")
    unknown = [n for n in names if n not in PERCENTILE_METRICS]
    if unknown:
        raise InvalidRequestError(f"--percentile-metrics {','.join(unknown)}: choose from "
                                  f"{', '.join(PERCENTILE_METRICS)}", "percentile_metrics")
    return names


def parse_key_values(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    """``KEY=VALUE`` items (``--header``, ``--metadata``), split at the first ``=``, stripped.

    Raises:
        InvalidRequestError: an item without ``=``.
    """
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidRequestError(f"{flag} {item!r}: use KEY=VALUE", flag.lstrip("-"))
        pairs[key.strip()] = value.strip()
    return pairs


def percentile_key(p: float) -> str:
    """``99.0`` -> ``"99"``, ``99.9`` -> ``"99.9"`` (vLLM's ``p_word``)."""
    return str(int(p)) if int(p) == p else str(p)


def _stats(values: Sequence[float], percentiles: Sequence[float]) -> tuple[float, float, float, list]:
    data = list(values) or [0.0]
    pcts = [(p, float(np.percentile(data, p)) * 1000) for p in percentiles]
    return float(np.mean(data)) * 1000, float(np.median(data)) * 1000, float(np.std(data)) * 1000, pcts


def peak_output_tokens_per_s(done: Sequence[RequestFuncOutput]) -> float:
    """The most streamed chunks (tokens) in one whole second after the first send."""
    if not done:
        return 0.0
    first = min(o.start_time for o in done)
    seconds = int(math.ceil(max(o.start_time + o.latency for o in done) - first)) + 1
    counts = np.zeros(seconds)
    for o in done:
        for time_s in itertools.accumulate([o.start_time + o.ttft, *o.itl]):
            if 0 <= int(time_s - first) < seconds:
                counts[int(time_s - first)] += 1
    return float(counts.max())


def peak_completed_concurrency(done: Sequence[RequestFuncOutput]) -> int:
    events = sorted([(o.start_time, 1) for o in done] + [(o.start_time + o.latency, -1) for o in done])
    peak = now = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def _good(done: Sequence[RequestFuncOutput], slos_ms: dict[str, float]) -> int:
    """Requests within every SLO; a request of one token has TPOT 0 (vLLM)."""
    good = 0
    for o in done:
        values = {"ttft": o.ttft, "tpot": request_tpot(o) or 0.0, "e2el": o.latency}
        good += all(values[name] <= limit / 1000 for name, limit in slos_ms.items())
    return good


def measurements(run: ServeRun) -> dict[str, Any]:
    """vLLM's ``benchmark()`` result of ``run`` before the percentile keys."""
    outputs, duration = run.outputs, run.metrics.duration_s
    done = [o for o in outputs if o.success]
    output_lens = [(o.output_tokens or 0) if o.success else 0 for o in outputs]
    total_in, total_out = sum(o.prompt_len for o in done), sum(output_lens)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    slos = run.config.goodput_slos_ms
    return {
        "duration": duration, "completed": len(done), "failed": len(outputs) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": per_s(len(done)),
        "request_goodput": per_s(_good(done, slos)) if slos else None,
        "output_throughput": per_s(total_out), "total_token_throughput": per_s(total_in + total_out),
        "input_lens": [o.prompt_len for o in outputs], "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
        "latencies": [o.latency for o in outputs], "start_times": [o.start_time for o in outputs],
        "queue_times": [o.client_queue_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs], "errors": [o.error for o in outputs],
        "max_output_tokens_per_s": peak_output_tokens_per_s(done),
        "max_concurrent_requests": peak_completed_concurrency(done), "rtfx": 0.0,
    }


def _metric_values(run: ServeRun) -> dict[str, list[float] | None]:
    done = [o for o in run.outputs if o.success]
    capped, finite = run.config.max_concurrency is not None, not math.isinf(run.config.request_rate)
    return {
        "ttft": [o.ttft for o in done], "tpot": [t for t in (request_tpot(o) for o in done) if t is not None],
        "itl": [gap for o in done for gap in o.itl], "e2el": [o.latency for o in done],
        "client_queue_time": [o.client_queue_time for o in done] if capped else None,
        "e2el_including_client_queue": [o.latency + o.client_queue_time for o in done] if capped and finite else None,
    }


def header_keys(header: ResultHeader, run: ServeRun) -> dict[str, Any]:
    """vLLM's run description keys (``main_async``), in vLLM's order."""
    config = run.config
    keys: dict[str, Any] = {
        "date": header.date, "endpoint_type": header.backend,
        "backend": header.backend, "label": header.label, "model_id": header.model_id,
        "tokenizer_id": header.tokenizer_id, "num_prompts": header.num_prompts, **header.metadata,
        "request_rate": config.request_rate if math.isfinite(config.request_rate) else "inf",
        "burstiness": config.burstiness, "max_concurrency": config.max_concurrency,
    }
    if config.ramp_up is not None:
        keys.update(ramp_up_strategy=config.ramp_up.strategy, ramp_up_start_rps=config.ramp_up.start_rps,
                    ramp_up_end_rps=config.ramp_up.end_rps)
    return keys


def flat_result(run: ServeRun, header: ResultHeader, selected: Sequence[str], percentiles: Sequence[float],
                save_detailed: bool) -> dict[str, Any]:
    """The JSON ``vllm bench serve`` would write for ``run``."""
    result = {**header_keys(header, run), **measurements(run)}
    if run.rps_change_events:
        result["rps_change_events"] = run.rps_change_events
    values = _metric_values(run)
    for name in PERCENTILE_METRICS:
        if name not in selected or values[name] is None:
            continue
        mean, median, std, pcts = _stats(values[name], percentiles)
        result.update({f"mean_{name}_ms": mean, f"median_{name}_ms": median, f"std_{name}_ms": std})
        result.update({f"p{percentile_key(p)}_{name}_ms": v for p, v in pcts})
    if not save_detailed:
        for key in DETAILED_KEYS:
            result.pop(key, None)
    return result


def format_summary(result: dict[str, Any], selected: Sequence[str], percentiles: Sequence[float]) -> str:
    """The block ``vllm bench serve`` prints after a run, from the flat result."""
    line = "{:<40} {:<10}".format
    num = "{:<40} {:<10.2f}".format
    out = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
           line("Successful requests:", result["completed"]), line("Failed requests:", result["failed"])]
    if result["max_concurrency"] is not None:
        out.append(line("Maximum request concurrency:", result["max_concurrency"]))
    if result["request_rate"] != "inf":
        out.append(num("Request rate configured (RPS):", result["request_rate"]))
    out += [num("Benchmark duration (s):", result["duration"]),
            line("Total input tokens:", result["total_input_tokens"]),
            line("Total generated tokens:", result["total_output_tokens"]),
            num("Request throughput (req/s):", result["request_throughput"])]
    if result["request_goodput"] is not None:
        out.append(num("Request goodput (req/s):", result["request_goodput"]))
    out += [num("Output token throughput (tok/s):", result["output_throughput"]),
            num("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"]),
            num("Peak concurrent requests:", result["max_concurrent_requests"]),
            num("Total token throughput (tok/s):", result["total_token_throughput"])]
    for name in PERCENTILE_METRICS:
        if name not in selected or f"mean_{name}_ms" not in result:
            continue
        short, title = _HEADERS[name]
        out += ["{s:{c}^{n}}".format(s=title, n=50, c="-"), num(f"Mean {short} (ms):", result[f"mean_{name}_ms"]),
                num(f"Median {short} (ms):", result[f"median_{name}_ms"])]
        out += [num(f"P{percentile_key(p)} {short} (ms):", result[f"p{percentile_key(p)}_{name}_ms"])
                for p in percentiles]
    out.append("=" * 50)
    return "\n".join(out)


def result_filename(header: ResultHeader, run: ServeRun, result_dir: str | None,
                    result_filename_arg: str | None) -> str:
    """vLLM's ``compute_result_filename``: ``{label}-{rate}qps[-concurrency{c}]-{model}-{date}.json``
    (ramp-up: ``{label}-ramp-up-{strategy}-{start}qps-{end}qps...``), ``--result-filename`` instead,
    inside ``--result-dir`` (created)."""
    config = run.config
    label = header.label or header.backend
    concurrency = f"-concurrency{config.max_concurrency}" if config.max_concurrency is not None else ""
    model = header.model_id.split("/")[-1]
    if config.ramp_up is not None:
        r = config.ramp_up
        name = f"{label}-ramp-up-{r.strategy}-{r.start_rps}qps-{r.end_rps}qps{concurrency}-{model}-{header.date}.json"
    else:
        name = f"{label}-{config.request_rate}qps{concurrency}-{model}-{header.date}.json"
    name = result_filename_arg or name
    if result_dir:
        os.makedirs(result_dir, exist_ok=True)
        name = os.path.join(result_dir, name)
    return name
