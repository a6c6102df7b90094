"""The KV connector's series of ``/metrics`` (kvserve's; vLLM's ``external_prefix_cache_*`` and
``prompt_tokens_cached_by_source`` are in ``kvserve.metrics.prometheus``), read from the latest
``SchedulerStats`` at scrape time, absent without a connector:

    <prefix>kv_connector_bytes_total{tier, direction}   bytes loaded into the cache (load) or
                                                        given to a tier (store)
    <prefix>kv_connector_load_seconds_total             time spent writing loaded blocks
    <prefix>kv_tier_blocks{tier}, kv_tier_bytes{tier}   what each tier holds now
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvserve.scheduler.stats import SchedulerStats


class KVTransferCollector:
    def __init__(self, model_name: str, snapshot: Callable[[], SchedulerStats], prefix: str):
        self.model_name = model_name
        self.snapshot = snapshot
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        stats = self.snapshot().kv_transfer
        if stats is None:
            return
        p, name = self.prefix, self.model_name
        moved = CounterMetricFamily(p + "kv_connector_bytes", "KV bytes loaded from a tier into the cache (load) "
                                    "or given to a tier (store).", labels=["model_name", "tier", "direction"])
        for direction, values in (("load", stats.loaded_bytes), ("store", stats.stored_bytes)):
            for tier, value in values.items():
                moved.add_metric([name, tier, direction], value)
        yield moved
        seconds = CounterMetricFamily(p + "kv_connector_load_seconds", "Seconds spent writing loaded blocks into "
                                      "the cache.", labels=["model_name"])
        seconds.add_metric([name], stats.load_seconds)
        yield seconds
        for metric, doc, values in (("kv_tier_blocks", "KV blocks each tier holds.", stats.tier_blocks),
                                    ("kv_tier_bytes", "Bytes each tier holds.", stats.tier_bytes)):
            family = GaugeMetricFamily(p + metric, doc, labels=["model_name", "tier"])
            for tier, value in values.items():
                family.add_metric([name, tier], value)
            yield family
