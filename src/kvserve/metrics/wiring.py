"""How observability is switched on: the consumer interface, the flags and the wiring.

    kvserve serve flags ──► ObservabilityConfig ──► build_stats_consumers() ─┐
                                                                            ▼
    AsyncLLM engine thread ── on_step / on_request_aborted / on_request_rejected ──► consumers
    install_metrics(async_llm) ──► CollectorRegistry (per server) ──► GET /metrics
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry

from kvserve.metrics.log_format import LOG_FORMATS
from kvserve.metrics.log_stats import LoggingStatsLogger, RequestLogger
from kvserve.metrics.prometheus import DEFAULT_PREFIX, PrometheusStatsLogger, SchedulerStatsCollector, metric_prefix
from kvserve.metrics.kv_transfer import KVTransferCollector
from kvserve.metrics.slo import SLOStatsLogger, SLOStepCostCollector
from kvserve.metrics.stats import IterationStats

if TYPE_CHECKING:
    from kvserve.engine.async_llm import AsyncLLM
    from kvserve.engine.core import StepStats
    from kvserve.engine.output_processor import RequestState


class StatsConsumer(Protocol):
    """What ``AsyncLLM`` calls on its engine thread; implementations must be quick, not raise."""

    def on_step(self, step_stats: StepStats | None, finished: list[RequestState],
                iteration: IterationStats | None) -> None:
        """After each engine step: its stats (None if nothing ran), the requests that finished in
        it (all choices done), and what it delivered to clients."""

    def on_request_aborted(self, request_id: str) -> None:
        """A live request was aborted (client gone)."""

    def on_request_rejected(self, exc: BaseException) -> None:
        """A request was refused at admission with ``exc``."""


@dataclass(frozen=True)
class ObservabilityConfig:
    """Logs and traces (metrics are always on), and the metrics' name prefix.

    Attributes:
        log_stats_interval: seconds between summary lines; 0 = no summary.
        enable_log_requests: one access line per finished/aborted/rejected request.
        log_prompts: include prompt text in access lines.
        log_format: ``text`` or ``json``.
        otlp_traces_endpoint: OTLP collector URL; None = no tracing (OpenTelemetry not imported).
        metrics_prefix: every ``/metrics`` series is named ``<metrics_prefix>:<vLLM's name>``.
    """

    log_stats_interval: float = 10.0
    enable_log_requests: bool = False
    log_prompts: bool = False
    log_format: str = "text"
    otlp_traces_endpoint: str | None = None
    metrics_prefix: str = DEFAULT_PREFIX


def add_observability_args(parser: argparse.ArgumentParser) -> None:
    """Add the logging and tracing flags (``--log-level`` is ``kvserve.cli``'s)."""
    group = parser.add_argument_group("observability")
    group.add_argument("--log-stats-interval", type=float, default=10.0,
                       help="seconds between engine summary log lines; 0 disables them")
    group.add_argument("--enable-log-requests", action="store_true",
                       help="log one line per finished, aborted or rejected request")
    group.add_argument("--log-prompts", action="store_true", help="include prompt text in request log lines")
    group.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    group.add_argument("--otlp-traces-endpoint", default=None,
                       help="export OpenTelemetry traces over OTLP to this URL (needs kvserve[tracing])")
    group.add_argument("--metrics-prefix", default=DEFAULT_PREFIX, metavar="NAME",
                       help="prefix of every /metrics series: 'kvserve' (kvserve:num_requests_waiting) or 'vllm' "
                            "for vLLM's exact names (vllm:num_requests_waiting), read unchanged by what scrapes vLLM")


def observability_config_from_args(args: argparse.Namespace) -> ObservabilityConfig:
    """Raises: ValueError: a negative ``--log-stats-interval`` or a ``--metrics-prefix`` that is
    not a Prometheus name."""
    if args.log_stats_interval < 0:
        raise ValueError(f"--log-stats-interval must be >= 0 seconds, got {args.log_stats_interval}")
    metric_prefix(args.metrics_prefix)
    return ObservabilityConfig(
        log_stats_interval=args.log_stats_interval, enable_log_requests=args.enable_log_requests,
        log_prompts=args.log_prompts, log_format=args.log_format, otlp_traces_endpoint=args.otlp_traces_endpoint,
        metrics_prefix=args.metrics_prefix,
    )


def build_stats_consumers(config: ObservabilityConfig, model_name: str) -> list[Any]:
    """The log and trace consumers ``config`` asks for.

    Raises:
        ImportError: tracing asked for but OpenTelemetry is not installed (message says how).
    """
    consumers: list[Any] = []
    if config.log_stats_interval > 0:
        consumers.append(LoggingStatsLogger(config.log_stats_interval))
    if config.enable_log_requests:
        consumers.append(RequestLogger(config.log_prompts))
    if config.otlp_traces_endpoint:
        from kvserve.metrics.tracing import TracingStatsConsumer, make_otlp_tracer_provider

        provider = make_otlp_tracer_provider(config.otlp_traces_endpoint)
        consumers.append(TracingStatsConsumer(provider, model_name))
    return consumers


def install_metrics(async_llm: AsyncLLM, model_name: str | None = None,
                    prefix: str = DEFAULT_PREFIX) -> PrometheusStatsLogger:
    """Give ``async_llm`` its own ``CollectorRegistry`` (served by ``GET /metrics``) with the
    request series and the scheduler snapshot collector, every name starting ``prefix:``;
    returns the request-series logger, also set as ``async_llm.prometheus_metrics``
    (``build_app`` then counts refusals into it).

    Raises:
        ValueError: ``prefix`` is not a Prometheus name.
    """
    name = model_name or async_llm.model_name
    start = metric_prefix(prefix)
    registry = CollectorRegistry()
    metrics = PrometheusStatsLogger(name, async_llm.max_model_len, registry, start)
    registry.register(SchedulerStatsCollector(name, lambda: async_llm.snapshot, start,
                                              lambda: cache_config_info(async_llm.core)))
    registry.register(SLOStepCostCollector(name, lambda: async_llm.snapshot, start))
    registry.register(KVTransferCollector(name, lambda: async_llm.snapshot, start))
    async_llm.stats_consumers.append(metrics)
    async_llm.stats_consumers.append(SLOStatsLogger(name, registry, start))
    async_llm.metrics_registry = registry
    async_llm.prometheus_metrics = metrics
    return metrics


def cache_config_info(core: Any) -> dict[str, str] | None:
    """vLLM's ``cache_config_info`` labels (its ``CacheConfig`` field names, values as ``str``)
    for the fields kvserve has, or None before the engine is loaded."""
    if core is None:
        return None
    cache = core.config.cache
    return {"block_size": str(core.kv_plan.block_size), "cache_dtype": cache.kv_cache_dtype,
            "enable_prefix_caching": str(cache.enable_prefix_caching),
            "gpu_memory_utilization": str(cache.gpu_memory_utilization),
            "num_gpu_blocks": str(core.kv_plan.num_blocks)}
