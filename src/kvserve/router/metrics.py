"""The router's Prometheus series (prefix ``kvserve_router_``; underscores only, so
prometheus-adapter and KEDA take the names as they are).

Counted as requests pass (one registry per router):
    requests_total{worker, outcome}         outcome: ok, error (the client got an error),
                                            stream_error (in-band error after the first byte),
                                            client_disconnected (the client left mid-stream)
    retries_total{reason}                   connect, status_5xx, status_429, read (before any byte)
    ejections_total{worker, cause}          health (active checks), breaker (passive)
    readmissions_total{worker}
    routing_decisions_total{policy, reason}
    routed_prompt_tokens_total{policy}, routed_matched_tokens_total{policy}
                                            the router's own prediction of cached tokens
    time_to_first_token_seconds, inter_token_latency_seconds, e2e_request_latency_seconds
                                            histograms, through the router
Read at scrape time (a collector):
    worker_healthy / worker_in_flight / worker_num_requests_running / worker_num_requests_waiting /
    worker_kv_cache_usage_perc {worker, state}
    num_requests_waiting, num_requests_running, kv_cache_usage_perc   (fleet: sum, sum, mean)
    prefix_cache_hit_rate{policy}           workers' hits / queries since the router started
    ttft_seconds{quantile}, itl_seconds{quantile}   0.5 / 0.9 / 0.99 over the scaling window
    active_replicas, standby_replicas, desired_replicas   (``kvserve.router.scaling``)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from kvserve.metrics.buckets import INTER_TOKEN_LATENCY_BUCKETS, REQUEST_LATENCY_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS

PREFIX = "kvserve_router_"
QUANTILES = (0.5, 0.9, 0.99)


class RouterMetrics:
    """Counters and histograms updated by the request path (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(PREFIX + "requests", "Requests answered, by worker and outcome.",
                                ["worker", "outcome"], registry=r)
        self.retries = Counter(PREFIX + "retries", "Attempts retried on another worker before the first byte.",
                               ["reason"], registry=r)
        self.ejections = Counter(PREFIX + "ejections", "Workers taken out of rotation.", ["worker", "cause"],
                                 registry=r)
        self.readmissions = Counter(PREFIX + "readmissions", "Ejected workers taken back.", ["worker"], registry=r)
        self.decisions = Counter(PREFIX + "routing_decisions", "Routing decisions by policy and reason.",
                                 ["policy", "reason"], registry=r)
        self.prompt_tokens = Counter(PREFIX + "routed_prompt_tokens", "Prompt tokens routed.", ["policy"],
                                     registry=r)
        self.matched_tokens = Counter(PREFIX + "routed_matched_tokens",
                                      "Prompt tokens the chosen worker was expected to hold.", ["policy"], registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "TTFT through the router.",
                              buckets=TIME_TO_FIRST_TOKEN_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Gaps between streamed chunks.",
                             buckets=INTER_TOKEN_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Request latency through the router.",
                             buckets=REQUEST_LATENCY_BUCKETS, registry=r)


class FleetCollector:
    """Gauges read from the fleet at scrape time.

    Args:
        snapshot: returns ``(workers, fleet_values, hit_rates, quantiles)``: a list of
            ``(url, state, healthy, in_flight, running, waiting, kv_usage)``; a dict of fleet
            gauges (name -> value); policy -> hit rate; {"ttft"/"itl": {q: seconds}}.
    """

    def __init__(self, snapshot: Callable[[], tuple]):
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        workers, fleet, hit_rates, quantiles = self.snapshot()
        per_worker = {"worker_healthy": "1 when the worker passes its health checks.",
                      "worker_in_flight": "Requests the router has sent and not seen finish.",
                      "worker_num_requests_running": "The worker's running requests (last scrape).",
                      "worker_num_requests_waiting": "The worker's queue depth (last scrape).",
                      "worker_kv_cache_usage_perc": "The worker's KV-cache usage 0-1 (last scrape)."}
        families = {name: GaugeMetricFamily(PREFIX + name, doc, labels=["worker", "state"])
                    for name, doc in per_worker.items()}
        for url, state, healthy, in_flight, running, waiting, kv in workers:
            for name, value in zip(per_worker, (float(healthy), in_flight, running, waiting, kv)):
                families[name].add_metric([url, state], value)
        yield from families.values()
        for name, value in fleet.items():
            yield GaugeMetricFamily(PREFIX + name, name.replace("_", " ") + " (fleet).", value=value)
        hit = GaugeMetricFamily(PREFIX + "prefix_cache_hit_rate",
                                "Workers' prefix-cache hits / queries since the router started, by policy.",
                                labels=["policy"])
        for policy, rate in hit_rates.items():
            hit.add_metric([policy], rate)
        yield hit
        for kind, values in quantiles.items():
            family = GaugeMetricFamily(PREFIX + f"{kind}_seconds", f"{kind.upper()} quantiles over the scaling window.",
                                       labels=["quantile"])
            for q, value in values.items():
                family.add_metric([str(q)], value)
            yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())
