"""Prometheus metrics named as vLLM's, each labelled ``model_name`` and ``engine`` (``"0"``: one
engine core per server), the label set of vLLM's ``PrometheusStatLogger``. The prefix is
``kvserve:`` by default; ``--metrics-prefix vllm`` gives vLLM's exact names, so what scrapes a vLLM
server (autoscaling rules on ``vllm:num_requests_waiting``, gateways reading
``vllm:kv_cache_usage_perc``, vLLM's dashboards) reads kvserve unchanged.

Request-level series (histograms, token and success counters) are updated on the engine thread
from the stats objects; scheduler-level series (running, waiting, KV usage, prefix-cache and
preemption totals) are read from the engine's latest ``SchedulerStats`` at scrape time, so they
are right even while the engine is idle (after aborts no step runs to report them).

Source of the names, label sets and buckets: vLLM 0.32's ``vllm/v1/metrics/loggers.py``
(``PrometheusStatLogger``), ``vllm/v1/metrics/buckets.py`` and ``vllm/v1/engine/parallel_sampling.py``
(what is observed once per request of ``n`` choices). Series about what kvserve does not have are
exported as vLLM exports them on a server without it: the external (KV-connector) prefix cache
counts 0 without a connector, the multi-modal cache 0, ``engine_sleep_state`` reads ``awake`` (kvserve has no sleep
mode). Two deprecated vLLM names are exported beside their successors because vLLM's previous
Grafana dashboard queries them: ``time_per_output_token_seconds`` (the same per-token observations
as ``inter_token_latency_seconds``) and ``gpu_cache_usage_perc`` (= ``kv_cache_usage_perc``).
kvserve's own series: ``request_aborted_total``, ``request_rejected_total{reason}`` and the
per-adapter ``lora_prompt_tokens_total`` / ``lora_generation_tokens_total``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvserve.errors import InvalidRequestError, RequestRejectedError
from kvserve.metrics.buckets import (
    INTER_TOKEN_LATENCY_BUCKETS,
    ITERATION_TOKENS_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    REQUEST_NUM_PREEMPTIONS_BUCKETS,
    REQUEST_PARAMS_N_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
    request_tokens_buckets,
)
from kvserve.metrics.stats import FinishedRequestStats, IterationStats, finished_request_stats
from kvserve.scheduler.stats import SchedulerStats

DEFAULT_PREFIX = "kvserve"
# vLLM's ``FinishReason`` strings; kvserve never finishes for ``repetition`` but, as vLLM, every
# label exists from the start.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
ENGINE = "0"  # the ``engine`` label: vLLM numbers its engine cores; kvserve has one per server
LABELS = ("model_name", "engine")
_PREFIX_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def metric_prefix(name: str) -> str:
    """``name`` + ``:``, the start of every series name (``--metrics-prefix``).

    Raises:
        ValueError: ``name`` is not a Prometheus name (letters, digits and ``_``, not starting
            with a digit).
    """
    if not _PREFIX_RE.fullmatch(name):
        raise ValueError(f"--metrics-prefix must be letters, digits and '_' not starting with a digit "
                         f"(e.g. 'kvserve' or 'vllm'), got {name!r}")
    return name + ":"


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
        prefix: the start of every name (``metric_prefix``).
        cache_info: returns vLLM's ``cache_config_info`` labels once the engine is loaded, else
            None (the series appears after the load).
    """

    def __init__(self, model_name: str, snapshot: Callable[[], SchedulerStats], prefix: str = "kvserve:",
                 cache_info: Callable[[], dict[str, str] | None] = lambda: None):
        self.model_name = model_name
        self.snapshot = snapshot
        self.prefix = prefix
        self.cache_info = cache_info

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot()
        yield self._gauge("num_requests_running", "Requests in the running batch.", s.num_running)
        yield self._gauge("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield self._labelled(GaugeMetricFamily, "num_requests_waiting_by_reason",
                             "Waiting requests by reason: 'capacity' = waiting for room in the batch or "
                             "the KV cache; 'deferred' = passed over at the last step (LoRA budget, a "
                             "prefix being computed by another request). Sums to num_requests_waiting.",
                             "reason", {"capacity": s.num_waiting - s.num_deferred, "deferred": s.num_deferred})
        yield self._labelled(GaugeMetricFamily, "engine_sleep_state",
                             "Engine sleep state: kvserve has no sleep mode, so awake = 1.", "sleep_state",
                             {state: int(state == "awake") for state in SLEEP_STATES})
        yield self._gauge("kv_cache_usage_perc", "Fraction (0-1) of KV-cache blocks in use.", s.kv_cache_usage)
        yield self._gauge("gpu_cache_usage_perc", "Fraction (0-1) of KV-cache blocks in use. "
                          f"DEPRECATED (vLLM's old name): use {self.prefix}kv_cache_usage_perc.", s.kv_cache_usage)
        yield self._counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                            s.prefix_cache_queries)
        yield self._counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_cache_hits)
        transfer = s.kv_transfer
        yield self._counter("external_prefix_cache_queries", "Prompt tokens looked up beyond the prefix cache "
                            "(the KV connector's tiers: --kv-offload-dir, --kv-role consumer).",
                            0 if transfer is None else transfer.external_queries)
        yield self._counter("external_prefix_cache_hits", "Prompt tokens found beyond the prefix cache and loaded.",
                            0 if transfer is None else transfer.external_hits)
        yield self._counter("mm_cache_queries", "Multi-modal cache queries: kvserve serves text models.", 0)
        yield self._counter("mm_cache_hits", "Multi-modal cache hits.", 0)
        by_source = {} if transfer is None else transfer.hits_by_source
        yield self._labelled(CounterMetricFamily, "prompt_tokens_cached_by_source",
                             "Cached prompt tokens by the tier that supplied them: device = the prefix cache, "
                             "disk = --kv-offload-dir, p2p = a prefill instance (--kv-role consumer).", "source",
                             {source: s.prefix_cache_hits if source == "device" else by_source.get(source, 0)
                              for source in CACHE_HIT_SOURCES})
        yield self._counter("num_preemptions", "Requests preempted (recompute).", s.num_preemptions)
        info = self.cache_info()
        if info is not None:
            family = GaugeMetricFamily(self.prefix + "cache_config_info",
                                       "Information of the KV cache's configuration.", labels=[*info, "engine"])
            family.add_metric([*info.values(), ENGINE], 1)
            yield family
        if s.spec_decoding is not None:
            yield from self._spec_decoding(s.spec_decoding)
        if s.lora is not None:
            yield self._lora_info(s.lora)

    def _lora_info(self, lora) -> Metric:
        """vLLM's ``lora_requests_info`` (its label set: no ``model_name`` or ``engine``): the
        adapters of running and waiting requests as comma-separated label values, the value the
        time of the reading (seconds)."""
        family = GaugeMetricFamily(self.prefix + "lora_requests_info", "Running stats on LoRA requests.",
                                   labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
        family.add_metric([str(lora.max_loras), ",".join(sorted(lora.waiting)), ",".join(sorted(lora.running))],
                          time.time())
        return family

    def _spec_decoding(self, spec) -> Iterator[Metric]:
        """vLLM's speculative-decoding counters (``vllm/v1/spec_decode/metrics.py``); acceptance
        rate = rate(accepted) / rate(draft tokens), mean acceptance length = 1 + rate(accepted) /
        rate(drafts)."""
        yield self._counter("spec_decode_num_drafts", "Number of spec decoding drafts.", spec.num_drafts)
        yield self._counter("spec_decode_num_draft_tokens", "Number of draft tokens.", spec.num_draft_tokens)
        yield self._counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.", spec.num_accepted_tokens)
        yield self._labelled(CounterMetricFamily, "spec_decode_num_accepted_tokens_per_pos",
                             "Accepted tokens per draft position.", "position",
                             {str(position): count for position, count in enumerate(spec.num_accepted_tokens_per_pos)})

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(self.prefix + name, doc, labels=list(LABELS))
        family.add_metric([self.model_name, ENGINE], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        family = CounterMetricFamily(self.prefix + name, doc, labels=list(LABELS))
        family.add_metric([self.model_name, ENGINE], value)
        return family

    def _labelled(self, kind: type, name: str, doc: str, label: str, values: dict[str, float]) -> Metric:
        """One series per ``values`` key, labelled ``label``."""
        family = kind(self.prefix + name, doc, labels=[*LABELS, label])
        for key, value in values.items():
            family.add_metric([self.model_name, ENGINE, key], value)
        return family


class PrometheusStatsLogger:
    """The stats consumer behind ``GET /metrics`` (see :class:`kvserve.metrics.StatsConsumer`).

    What is observed when (as vLLM's ``PrometheusStatLogger.record``):

    =====================================  ==================================================
    per engine step that ran               ``iteration_tokens_total`` (prompt tokens computed
                                           (not from the prefix cache) for the choices that
                                           got their first token + tokens generated)
    per token delivered                    ``inter_token_latency_seconds`` and its deprecated
                                           twin ``time_per_output_token_seconds``
    per first token of a choice            ``prompt_tokens`` (and ``_by_source``,
                                           ``prompt_tokens_cached``)
    per finished choice                    latency histograms, token histograms, preemptions,
                                           ``request_params_max_tokens`` (when set), success
    per finished request (all n choices)   ``request_params_n``,
                                           ``request_max_num_generation_tokens`` (most tokens
                                           generated by one of its choices)
    =====================================  ==================================================

    Args:
        model_name: the ``model_name`` label of every series.
        max_model_len: longest request in tokens (upper token bucket).
        registry: where the series live; one per server so servers in one process don't clash.
        prefix: the start of every name (``metric_prefix``).
    """

    def __init__(self, model_name: str, max_model_len: int, registry: CollectorRegistry, prefix: str = "kvserve:"):
        self.model_name = model_name
        self.prefix = prefix
        self._registry = registry
        self._init_latency_histograms()
        self._init_token_histograms(request_tokens_buckets(max_model_len))
        self._init_counters()

    def _hist(self, name: str, doc: str, buckets) -> Histogram:
        metric = Histogram(self.prefix + name, doc, list(LABELS), buckets=buckets, registry=self._registry)
        return metric.labels(self.model_name, ENGINE)

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        metric = Counter(self.prefix + name, doc, [*LABELS, *extra], registry=self._registry)
        return metric if extra else metric.labels(self.model_name, ENGINE)

    def _init_latency_histograms(self) -> None:
        ttft, itl, request = TIME_TO_FIRST_TOKEN_BUCKETS, INTER_TOKEN_LATENCY_BUCKETS, REQUEST_LATENCY_BUCKETS
        self.time_to_first_token = self._hist("time_to_first_token_seconds", "TTFT, seconds.", ttft)
        self.inter_token_latency = self._hist("inter_token_latency_seconds", "ITL, seconds.", itl)
        self.time_per_output_token_deprecated = self._hist(
            "time_per_output_token_seconds",
            f"ITL, seconds. DEPRECATED (vLLM's old name): use {self.prefix}inter_token_latency_seconds.", itl)
        self.time_per_output_token = self._hist("request_time_per_output_token_seconds",
                                                "TPOT = decode time / (generation tokens - 1), seconds.", itl)
        self.e2e_latency = self._hist("e2e_request_latency_seconds", "Arrival to finish, seconds.", request)
        self.queue_time = self._hist("request_queue_time_seconds", "Arrival to first scheduled, seconds.", request)
        self.inference_time = self._hist("request_inference_time_seconds",
                                         "First scheduled to finish (prefill + decode), seconds.", request)
        self.prefill_time = self._hist("request_prefill_time_seconds", "First scheduled to first token, seconds.",
                                       request)
        self.decode_time = self._hist("request_decode_time_seconds", "First token to finish, seconds.", request)

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
        self.params_n = self._hist("request_params_n", "The n parameter of finished requests.",
                                   REQUEST_PARAMS_N_BUCKETS)
        self.iteration_tokens = self._hist("iteration_tokens_total",
                                           "Tokens per engine step (prompt tokens computed for choices that got "
                                           "their first token + tokens generated).", ITERATION_TOKENS_BUCKETS)
        self.num_preemptions_hist = self._hist("request_num_preemptions",
                                               "Times a finished request was preempted.",
                                               REQUEST_NUM_PREEMPTIONS_BUCKETS)
        self.prefill_kv_computed = self._hist("request_prefill_kv_computed_tokens",
                                              "Prompt tokens of a finished request computed, not found in the "
                                              "prefix cache.", tokens)

    def _init_counters(self) -> None:
        self.prompt_tokens = self._counter("prompt_tokens", "Prompt tokens processed.")
        by_source = self._counter("prompt_tokens_by_source", "Prompt tokens by source.", ("source",))
        self.prompt_tokens_by_source = {source: by_source.labels(self.model_name, ENGINE, source)
                                        for source in PROMPT_TOKEN_SOURCES}
        self.prompt_tokens_cached = self._counter("prompt_tokens_cached", "Prompt tokens found in the prefix cache.")
        self.generation_tokens = self._counter("generation_tokens", "Tokens generated.")
        self.request_success = self._counter("request_success", "Finished requests by finish reason.",
                                             ("finished_reason",))
        self.admission_rejections = Counter(self.prefix + "admission_rejections",
                                            "Requests refused because the waiting queue was full, by the limit.",
                                            ["model_name", "reason"], registry=self._registry)
        self.request_aborted = self._counter("request_aborted", "Requests aborted (client gone).")
        self.request_rejected = self._counter("request_rejected", "Generation requests refused (error response).",
                                              ("reason",))
        self.lora_prompt_tokens = self._counter("lora_prompt_tokens", "Prompt tokens processed, per LoRA adapter.",
                                                ("lora_name",))
        self.lora_generation_tokens = self._counter("lora_generation_tokens", "Tokens generated, per LoRA adapter.",
                                                    ("lora_name",))
        for reason in FINISH_REASONS:
            self.request_success.labels(self.model_name, ENGINE, reason)
        for reason in ADMISSION_REASONS:
            self.admission_rejections.labels(self.model_name, reason)

    def on_step(self, step_stats, finished: list, iteration: IterationStats | None) -> None:
        if iteration is not None:
            self.observe_iteration(iteration, step_ran=step_stats is not None)
        for state in finished:
            self.observe_finished_request(state)

    def observe_iteration(self, iteration: IterationStats, step_ran: bool = True) -> None:
        """Counters and per-token histograms of one step; ``iteration_tokens_total`` only for a
        step that ran (``step_ran``), as vLLM records it once per engine step."""
        computed = iteration.num_prompt_tokens - iteration.num_cached_prompt_tokens
        self.prompt_tokens.inc(iteration.num_prompt_tokens)
        self.prompt_tokens_by_source["local_compute"].inc(computed)
        external = iteration.num_external_prompt_tokens
        self.prompt_tokens_by_source["local_cache_hit"].inc(iteration.num_cached_prompt_tokens - external)
        self.prompt_tokens_by_source["external_kv_transfer"].inc(external)
        self.prompt_tokens_cached.inc(iteration.num_cached_prompt_tokens)
        self.generation_tokens.inc(iteration.num_generation_tokens)
        if step_ran:
            self.iteration_tokens.observe(computed + iteration.num_generation_tokens)
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
        self.num_preemptions_hist.observe(stats.num_preemptions)
        self.prefill_kv_computed.observe(stats.num_prompt_tokens - stats.num_cached_tokens)
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
        """A refused generation request; a full waiting queue (``queue_full``, the
        ``--max-num-waiting`` bound) is also vLLM's ``admission_rejections{reason="max_num_queued_reqs"}``."""
        self.request_rejected.labels(self.model_name, ENGINE, reason).inc()
        if reason == "queue_full":
            self.admission_rejections.labels(self.model_name, "max_num_queued_reqs").inc()
