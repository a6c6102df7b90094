"""Observability: Prometheus metrics, log lines and OpenTelemetry traces, all fed by the small
stats objects the engine emits (``StepStats``, ``IterationStats``, finished ``RequestState``s).

    stats.py        IterationStats, FinishedRequestStats (derived per-request durations)
    prometheus.py   PrometheusStatsLogger, SchedulerStatsCollector (vLLM's series, ``kvserve:`` or ``vllm:``)
    buckets.py      vLLM's histogram bucket boundaries
    http.py         RejectionCounterMiddleware (refused requests, counted where clients see them)
    log_stats.py    LoggingStatsLogger (periodic summary), RequestLogger (access lines)
    log_format.py   configure_logging (text / JSON)
    tracing.py      TracingStatsConsumer (imports OpenTelemetry only when used)
    wiring.py       StatsConsumer protocol, flags, install_metrics, build_stats_consumers
"""

from kvserve.metrics.stats import FinishedRequestStats, IterationStats, finished_request_stats

__all__ = ["FinishedRequestStats", "IterationStats", "finished_request_stats"]
