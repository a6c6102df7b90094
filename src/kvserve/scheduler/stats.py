"""What the scheduler reports to the metrics layer (read-only snapshots; no metric code here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.slo.scheduling import SLOStats
from kvserve.spec_decode.stats import SpecDecodingStats


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot taken by ``Scheduler.make_stats()``.

    Attributes:
        num_running: requests holding KV blocks and scheduled each step.
        num_waiting: queued requests (new and preempted).
        num_deferred: of those, the ones the last step passed over while admitting later ones (an
            adapter beyond ``max_loras``, a prefix another request is computing); vLLM's
            ``deferred`` waiting reason.
        kv_cache_usage: fraction (0-1) of usable KV blocks in use.
        prefix_cache_queries: prompt tokens looked up in the prefix cache (total, tokens).
        prefix_cache_hits: of those, tokens found (total, tokens).
        num_preemptions: requests preempted since start-up (total).
        num_steps: non-empty steps scheduled since start-up.
        num_scheduled_tokens: tokens scheduled over all steps (prefill + decode, total).
        num_generated_tokens: tokens sampled and appended over all steps (total).
        num_finished_requests: requests finished or aborted since start-up (total).
        spec_decoding: speculative-decoding totals, or None when speculation is off.
        lora: adapters of running and waiting requests, or None when LoRA is off.
        slo: the latency-target side (the step-cost model, prediction errors), or None.
        kv_transfer: the KV connector's lookups, loads, stores and tiers, or None without one.
    """

    num_running: int = 0
    num_waiting: int = 0
    num_deferred: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    num_scheduled_tokens: int = 0
    num_generated_tokens: int = 0
    num_finished_requests: int = 0
    spec_decoding: SpecDecodingStats | None = None
    lora: LoRAStats | None = None
    slo: SLOStats | None = None
    kv_transfer: KVTransferStats | None = None


@dataclass(frozen=True)
class KVTransferStats:
    """The KV connector's totals since start-up (``kvserve.kv_transfer``).

    Attributes:
        external_queries, external_hits: prompt tokens looked up beyond the pool / found (vLLM's
            ``external_prefix_cache_*``).
        hits_by_source: found tokens by tier (``disk``, ``p2p``).
        loaded_bytes, stored_bytes: by tier.
        load_seconds: time spent writing loaded blocks into the cache.
        tier_blocks, tier_bytes: what each tier holds now.
    """

    external_queries: int = 0
    external_hits: int = 0
    hits_by_source: dict[str, int] = field(default_factory=dict)
    loaded_bytes: dict[str, int] = field(default_factory=dict)
    stored_bytes: dict[str, int] = field(default_factory=dict)
    load_seconds: float = 0.0
    tier_blocks: dict[str, int] = field(default_factory=dict)
    tier_bytes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LoRAStats:
    """Adapters in use (vLLM's ``LoRAStats``, read by ``lora_requests_info``).

    Attributes:
        max_loras: most adapters in one batch (``--max-loras``).
        running: adapter name -> running requests with it.
        waiting: adapter name -> waiting requests with it.
    """

    max_loras: int
    running: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)
