"""Prometheus metrics named as vLLM's (prefix ``kvserve:``), each labelled ``model_name`` and
``engine`` (``"0"``: one engine core per server), the label set of vLLM's ``PrometheusStatLogger``.

Request-level series (histograms, token and success counters) are updated on the engine thread
from the stats objects; scheduler-level series (running, waiting, KV usage, prefix-cache and
preemption totals) are read from the engine's latest ``SchedulerStats`` at scrape time, so they
are right even while the engine is idle (after aborts no step runs to report them).

Source of the names and meanings: vLLM's ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``)
and ``vllm/v1/engine/parallel_sampling.py`` (what is observed once per request of ``n`` choices).
Two deprecated vLLM names are exported beside their successors because vLLM's Grafana dashboards
still query them: ``time_per_output_token_seconds`` (the same per-token observations as
``inter_token_latency_seconds``) and ``gpu_cache_usage_perc`` (= ``kv_cache_usage_perc``).
"""

from __future__ import annotations

import time
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
ENGINE = "0"  # the ``engine`` label: vLLM numbers its engine cores; kvserve has one per server
LABELS = ("model_name", "engine")
# vLLM's buckets for these two (``iteration_tokens_total``: tokens per step; ``request_params_n``).
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)


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
        yield self._gauge("gpu_cache_usage_perc", "Fraction (0-1) of KV-cache blocks in use. "
                          "DEPRECATED (vLLM's old name): use kvserve:kv_cache_usage_perc.", s.kv_cache_usage)
        yield self._counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                            s.prefix_cache_queries)
        yield self._counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_cache_hits)
        yield self._counter("num_preemptions", "Requests preempted (recompute).", s.num_preemptions)
        if s.spec_decoding is not None:
            yield from self._spec_decoding(s.spec_decoding)
        if s.lora is not None:
            yield self._lora_info(s.lora)

    def _lora_info(self, lora) -> Metric:
        """vLLM's ``lora_requests_info``: the adapters of running and waiting requests as
        comma-separated label values, the value the time of the reading (seconds)."""
        family = GaugeMetricFamily(PREFIX + "lora_requests_info", "Running stats on LoRA requests.",
                                   labels=[*LABELS, "max_lora", "waiting_lora_adapters", "running_lora_adapters"])
        family.add_metric([self.model_name, ENGINE, str(lora.max_loras), ",".join(sorted(lora.waiting)),
                           ",".join(sorted(lora.running))], time.time())
        return family

    def _spec_decoding(self, spec) -> Iterator[Metric]:
        """vLLM's speculative-decoding counters (``vllm/v1/spec_decode/metrics.py``); acceptance
        rate = rate(accepted) / rate(draft tokens), mean acceptance length = 1 + rate(accepted) /
        rate(drafts)."""
        yield self._counter("spec_decode_num_drafts", "Number of spec decoding drafts.", spec.num_drafts)
        yield self._counter("spec_decode_num_draft_tokens", "Number of draft tokens.", spec.num_draft_tokens)
        yield self._counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.", spec.num_accepted_tokens)
        family = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                     "Accepted tokens per draft position.", labels=[*LABELS, "position"])
        for position, count in enumerate(spec.num_accepted_tokens_per_pos):
            family.add_metric([self.model_name, ENGINE, str(position)], count)
        yield family

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(PREFIX + name, doc, labels=list(LABELS))
        family.add_metric([self.model_name, ENGINE], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        family = CounterMetricFamily(PREFIX + name, doc, labels=list(LABELS))
        family.add_metric([self.model_name, ENGINE], value)
        return family


class PrometheusStatsLogger:
    """The stats consumer behind ``GET /metrics`` (see :class:`kvserve.metrics.StatsConsumer`).

    What is observed when (as vLLM's ``PrometheusStatLogger.record``):

    =====================================  ==================================================
    per engine step that ran               ``iteration_tokens_total`` (prompt tokens of the
                                           choices that got their first token + tokens
                                           generated, from the step's ``IterationStats``)
    per token delivered                    ``inter_token_latency_seconds`` and its deprecated
                                           twin ``time_per_output_token_seconds``
    per finished choice                    latency histograms, token histograms,
                                           ``request_params_max_tokens`` (when set), success
    per finished request (all n choices)   ``request_params_n``,
                                           ``request_max_num_generation_tokens`` (most tokens
                                           generated by one of its choices)
    =====================================  ==================================================

    Args:
        model_name: the ``model_name`` label of every series.
        max_model_len: longest request in tokens (upper token bucket).
        registry: where the series live; one per server so servers in one process don't clash.
    """

    def __init__(self, model_name: str, max_model_len: int, registry: CollectorRegistry):
        self.model_name = model_name
        self._registry = registry
        self._init_latency_histograms()
        self._init_token_histograms(token_buckets(max_model_len))
        self._init_counters()

    def _hist(self, name: str, doc: str, buckets) -> Histogram:
        metric = Histogram(PREFIX + name, doc, list(LABELS), buckets=buckets, registry=self._registry)
        return metric.labels(self.model_name, ENGINE)

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        metric = Counter(PREFIX + name, doc, [*LABELS, *extra], registry=self._registry)
        return metric if extra else metric.labels(self.model_name, ENGINE)

    def _init_latency_histograms(self) -> None:
        self.time_to_first_token = self._hist("time_to_first_token_seconds", "TTFT, seconds.", LATENCY_BUCKETS)
        self.inter_token_latency = self._hist("inter_token_latency_seconds", "ITL, seconds.", LATENCY_BUCKETS)
        self.time_per_output_token_deprecated = self._hist(
            "time_per_output_token_seconds",
            "ITL, seconds. DEPRECATED (vLLM's old name): use kvserve:inter_token_latency_seconds.",
            LATENCY_BUCKETS)
        self.time_per_output_token = self._hist("request_time_per_output_token_seconds",
                                                "TPOT = decode time / (generation tokens - 1), seconds.",
                                                LATENCY_BUCKETS)
        self.e2e_latency = self._hist("e2e_request_latency_seconds", "Arrival to finish, seconds.", LATENCY_BUCKETS)
        self.queue_time = self._hist("request_queue_time_seconds", "Arrival to first scheduled, seconds.",
                                     LATENCY_BUCKETS)
        self.inference_time = self._hist("request_inference_time_seconds",
                                         "First scheduled to finish (prefill + decode), seconds.", LATENCY_BUCKETS)
        self.prefill_time = self._hist("request_prefill_time_seconds", "First scheduled to first token, seconds.",
                                       LATENCY_BUCKETS)
        self.decode_time = self._hist("request_decode_time_seconds", "First token to finish, seconds.",
                                      LATENCY_BUCKETS)

    def _init_token_histograms(self, tokens: list[int]) -> None:
        self.prompt_tokens_hist = self._hist("request_prompt_tokens", "Prompt length of finished requests, tokens.",
                                             tokens)
        self.generation_tokens_hist = self._hist("request_generation_tokens",
                                                 "Generated length of finished requests, tokens.", tokens)
        self.max_generation_tokens_hist = self._hist(
            "request_max_num_generation_tokens",
            "Most tokens generated by one choice of a finished request (of its n), tokens.", tokens)
        self.params_max_tokens = self._hist("request_params_max_tokens",
                                            "The max_tokens parameter of finished requests, tokens.", tokens)
        self.params_n = self._hist("request_params_n", "The n parameter of finished requests.", N_BUCKETS)
        self.iteration_tokens = self._hist("iteration_tokens_total",
                                           "Tokens per engine step (prompt tokens of choices that got their "
                                           "first token + tokens generated).", ITERATION_TOKEN_BUCKETS)

    def _init_counters(self) -> None:
        self.prompt_tokens = self._counter("prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = self._counter("generation_tokens", "Tokens generated.")
        self.request_success = self._counter("request_success", "Finished requests by finish reason.",
                                             ("finished_reason",))
        self.request_aborted = self._counter("request_aborted", "Requests aborted (client gone).")
        self.request_rejected = self._counter("request_rejected", "Generation requests refused (error response).",
                                              ("reason",))
        self.lora_prompt_tokens = self._counter("lora_prompt_tokens", "Prompt tokens processed, per LoRA adapter.",
                                                ("lora_name",))
        self.lora_generation_tokens = self._counter("lora_generation_tokens", "Tokens generated, per LoRA adapter.",
                                                    ("lora_name",))
        for reason in FINISH_REASONS:
            self.request_success.labels(self.model_name, ENGINE, reason)

    def on_step(self, step_stats, finished: list, iteration: IterationStats | None) -> None:
        if iteration is not None:
            self.observe_iteration(iteration, step_ran=step_stats is not None)
        for state in finished:
            self.observe_finished_request(state)

    def observe_iteration(self, iteration: IterationStats, step_ran: bool = True) -> None:
        """Counters and per-token histograms of one step; ``iteration_tokens_total`` only for a
        step that ran (``step_ran``), as vLLM records it once per engine step."""
        self.prompt_tokens.inc(iteration.num_prompt_tokens)
        self.generation_tokens.inc(iteration.num_generation_tokens)
        if step_ran:
            self.iteration_tokens.observe(iteration.num_prompt_tokens + iteration.num_generation_tokens)
        for name, (prompt, generation) in iteration.lora_tokens.items():
            self.lora_prompt_tokens.labels(self.model_name, ENGINE, name).inc(prompt)
            self.lora_generation_tokens.labels(self.model_name, ENGINE, name).inc(generation)
        for value in iteration.time_to_first_tokens:
            self.time_to_first_token.observe(value)
        for value in iteration.inter_token_latencies:
            self.inter_token_latency.observe(value)
            self.time_per_output_token_deprecated.observe(value)

    def observe_finished_request(self, state) -> None:
        """A finished ``RequestState``: each choice, then the request's ``n`` and its longest choice."""
        choices = finished_request_stats(state)
        for stats in choices:
            self.observe_finished(stats, state.params.max_tokens)
        self.params_n.observe(len(state.choices))  # n: one choice per child request
        self.max_generation_tokens_hist.observe(max((c.num_generation_tokens for c in choices), default=0))

    def observe_finished(self, stats: FinishedRequestStats, max_tokens: int | None = None) -> None:
        """One finished choice; ``max_tokens`` is its request's parameter (not observed when
        None or 0, as vLLM)."""
        self.request_success.labels(self.model_name, ENGINE, stats.finish_reason).inc()
        self.e2e_latency.observe(stats.e2e_latency)
        self.queue_time.observe(stats.queue_time)
        self.inference_time.observe(stats.prefill_time + stats.decode_time)
        self.prefill_time.observe(stats.prefill_time)
        self.decode_time.observe(stats.decode_time)
        self.time_per_output_token.observe(stats.time_per_output_token)
        self.prompt_tokens_hist.observe(stats.num_prompt_tokens)
        self.generation_tokens_hist.observe(stats.num_generation_tokens)
        if max_tokens:
            self.params_max_tokens.observe(max_tokens)

    def on_request_aborted(self, request_id: str) -> None:
        self.request_aborted.inc()

    def on_request_rejected(self, exc: BaseException) -> None:
        """Not counted here: every refusal, the engine's included, is counted once where the
        client sees it (``kvserve.metrics.http.RejectionCounterMiddleware``)."""

    def count_rejected(self, reason: str) -> None:
        self.request_rejected.labels(self.model_name, ENGINE, reason).inc()
