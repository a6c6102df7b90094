"""Prometheus metrics named as vLLM's (prefix ``kvserve:``), each labelled ``model_name``.

Request-level series (histograms, token and success counters) are updated on the engine thread
from the stats objects; scheduler-level series (running, waiting, KV usage, prefix-cache and
preemption totals) are read from the engine's latest ``SchedulerStats`` at scrape time, so they
are right even while the engine is idle (after aborts no step runs to report them).

Source of the names and meanings: vLLM's ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvserve.errors import InvalidRequestError, RequestRejectedError
from kvserve.metrics.stats import FinishedRequestStats, IterationStats, finished_request_stats
from kvserve.scheduler.stats import SchedulerStats

PREFIX = "kvserve:"

# Seconds, from 1 ms (a GPU decode step) to 10 minutes (a long CPU request).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
FINISH_REASONS = ("stop", "length", "abort")


def token_buckets(max_model_len: int) -> list[int]:
    """1-2-5 buckets up to ``max_model_len`` tokens (as vLLM's ``build_1_2_5_buckets``)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_model_len:
                return buckets
            buckets.append(value)
        scale *= 10


def rejection_reason(exc: BaseException) -> str:
    """The ``reason`` label of a rejected request: ``RequestRejectedError.reason`` (``queue_full``,
    ``shutting_down``, ``engine_dead``), ``invalid_request`` for user mistakes, else ``error``."""
    if isinstance(exc, RequestRejectedError):
        return exc.reason
    if isinstance(exc, InvalidRequestError):
        return "invalid_request"
    return "error"


class SchedulerStatsCollector:
    """A custom collector turning the latest ``SchedulerStats`` into gauges and counters.

    Args:
        model_name: the ``model_name`` label.
        snapshot: returns the engine's latest snapshot (e.g. ``lambda: async_llm.snapshot``).
    """

    def __init__(self, model_name: str, snapshot: Callable[[], SchedulerStats]):
        self.model_name = model_name
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot()
        yield self._gauge("num_requests_running", "Requests in the running batch.", s.num_running)
        yield self._gauge("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield self._gauge("kv_cache_usage_perc", "Fraction (0-1) of KV-cache blocks in use.", s.kv_cache_usage)
        yield self._counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                            s.prefix_cache_queries)
        yield self._counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_cache_hits)
        yield self._counter("num_preemptions", "Requests preempted (recompute).", s.num_preemptions)

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        family = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family


class PrometheusStatsLogger:
    """The stats consumer behind ``GET /metrics`` (see :class:`kvserve.metrics.StatsConsumer`).

    Args:
        model_name: the ``model_name`` label of every series.
        max_model_len: longest request in tokens (upper token bucket).
        registry: where the series live; one per server so servers in one process don't clash.
    """

    def __init__(self, model_name: str, max_model_len: int, registry: CollectorRegistry):
        self.model_name = model_name
        labels = ["model_name"]
        tokens = token_buckets(max_model_len)

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=registry).labels(model_name)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            metric = Counter(PREFIX + name, doc, labels + list(extra), registry=registry)
            return metric if extra else metric.labels(model_name)

        self.time_to_first_token = hist("time_to_first_token_seconds", "TTFT, seconds.", LATENCY_BUCKETS)
        self.inter_token_latency = hist("inter_token_latency_seconds", "ITL, seconds.", LATENCY_BUCKETS)
        self.time_per_output_token = hist("request_time_per_output_token_seconds",
                                          "TPOT = decode time / (generation tokens - 1), seconds.",
                                          LATENCY_BUCKETS)
        self.e2e_latency = hist("e2e_request_latency_seconds", "Arrival to finish, seconds.", LATENCY_BUCKETS)
        self.queue_time = hist("request_queue_time_seconds", "Arrival to first scheduled, seconds.",
                               LATENCY_BUCKETS)
        self.prefill_time = hist("request_prefill_time_seconds", "First scheduled to first token, seconds.",
                                 LATENCY_BUCKETS)
        self.decode_time = hist("request_decode_time_seconds", "First token to finish, seconds.", LATENCY_BUCKETS)
        self.prompt_tokens_hist = hist("request_prompt_tokens", "Prompt length of finished requests, tokens.",
                                       tokens)
        self.generation_tokens_hist = hist("request_generation_tokens",
                                           "Generated length of finished requests, tokens.", tokens)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.request_success = counter("request_success", "Finished requests by finish reason.",
                                       ("finished_reason",))
        self.request_aborted = counter("request_aborted", "Requests aborted (client gone).")
        self.request_rejected = counter("request_rejected", "Generation requests refused (error response).",
                                        ("reason",))
        for reason in FINISH_REASONS:
            self.request_success.labels(model_name, reason)

    def on_step(self, step_stats, finished: list, iteration: IterationStats | None) -> None:
        if iteration is not None:
            self.observe_iteration(iteration)
        for state in finished:
            for stats in finished_request_stats(state):
                self.observe_finished(stats)

    def observe_iteration(self, iteration: IterationStats) -> None:
        self.prompt_tokens.inc(iteration.num_prompt_tokens)
        self.generation_tokens.inc(iteration.num_generation_tokens)
        for value in iteration.time_to_first_tokens:
            self.time_to_first_token.observe(value)
        for value in iteration.inter_token_latencies:
            self.inter_token_latency.observe(value)

    def observe_finished(self, stats: FinishedRequestStats) -> None:
        self.request_success.labels(self.model_name, stats.finish_reason).inc()
        self.e2e_latency.observe(stats.e2e_latency)
        self.queue_time.observe(stats.queue_time)
        self.prefill_time.observe(stats.prefill_time)
        self.decode_time.observe(stats.decode_time)
        self.time_per_output_token.observe(stats.time_per_output_token)
        self.prompt_tokens_hist.observe(stats.num_prompt_tokens)
        self.generation_tokens_hist.observe(stats.num_generation_tokens)

    def on_request_aborted(self, request_id: str) -> None:
        self.request_aborted.inc()

    def on_request_rejected(self, exc: BaseException) -> None:
        """Not counted here: every refusal, the engine's included, is counted once where the
        client sees it (``kvserve.metrics.http.RejectionCounterMiddleware``)."""

    def count_rejected(self, reason: str) -> None:
        self.request_rejected.labels(self.model_name, reason).inc()
