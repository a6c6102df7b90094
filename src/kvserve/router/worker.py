"""One worker as the router sees it: where it is, whether it may get requests, how loaded it is
and what its prefix cache holds.

    state:   active ──DELETE /workers──► draining ──(in flight = 0)──► removed
             standby ──promote──► active
    routable = active and healthy (active checks) and its circuit breaker allows

Load (what the policies compare) is ``in_flight + backlog``: requests the router has sent and not
seen finish, plus the part of the worker's own queue (``num_requests_running + waiting`` at the
last ``/metrics`` scrape) that the router did not send (other routers or direct clients).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvserve.kv_events.subscriber import KVEventSubscriber, WorkerBlockIndex
from kvserve.router.circuit_breaker import CircuitBreaker
from kvserve.router.prefix import ApproxPrefixIndex

# Seconds a routed prompt counts in the approximate index of a worker with KV events: long enough
# to cover its prefill (its BlockStored arrives after the step that computed it), short enough that
# evictions reported by events take over.
EVENT_WORKER_PENDING_TTL = 30.0


@dataclass(frozen=True)
class KVEventsEndpoint:
    """Where a worker publishes KV events (``endpoint``) and answers replays (``replay``)."""

    endpoint: str
    replay: str | None = None
    topic: str = ""

    @classmethod
    def parse(cls, text: str) -> KVEventsEndpoint:
        """``PUB,REPLAY`` (``tcp://h:p,tcp://h:r``; ``PUB,`` = no replay), or ``tcp://h:p`` alone
        (replay on p + 1), or an ``ipc://`` path alone (no replay)."""
        if "," in text:
            pub, replay = (part.strip() for part in text.split(",", 1))
            return cls(pub, replay or None)
        if not text.startswith("tcp://"):
            return cls(text, None)
        base, _, port = text.rpartition(":")
        return cls(text, f"{base}:{int(port) + 1}")


@dataclass
class WorkerLoad:
    """A worker's ``/metrics`` at one scrape (vLLM's series, ``kvserve:`` or ``vllm:`` prefix)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    scraped_at: float = 0.0
    in_flight_at_scrape: int = 0
    predicted_ttft: float | None = None  # kvserve's slo_predicted_ttft_seconds (a 128-token prompt)
    prefill_token_cost: float | None = None  # kvserve's slo_step_cost_seconds{term="prefill_token"}


@dataclass
class Worker:
    """Args/attributes:
        url: ``http://host:port`` (no trailing slash).
        model: the served model name (from the registry or the worker's ``/v1/models``).
        root: the model's ``root`` as the worker's ``/v1/models`` reports it (its path), or None.
        state: ``active``, ``standby`` or ``draining``.
        kv_events: where it publishes KV events, or None (approximate index only).
    """

    url: str
    model: str | None = None
    root: str | None = None
    state: str = "active"
    kv_events: KVEventsEndpoint | None = None
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    healthy: bool = False
    check_failures: int = 0
    check_successes: int = 0
    in_flight: int = 0
    load_snapshot: WorkerLoad = field(default_factory=WorkerLoad)
    event_index: WorkerBlockIndex | None = None
    subscriber: KVEventSubscriber | None = None
    approx_index: ApproxPrefixIndex = field(default_factory=ApproxPrefixIndex)
    num_requests: int = 0
    added_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if self.kv_events is not None:
            self.approx_index.ttl = EVENT_WORKER_PENDING_TTL

    @property
    def routable(self) -> bool:
        return self.state == "active" and self.healthy and self.breaker.allows()

    @property
    def load(self) -> float:
        """Requests the worker is busy with (see the module docstring)."""
        snap = self.load_snapshot
        backlog = max(0.0, snap.running + snap.waiting - snap.in_flight_at_scrape)
        return self.in_flight + backlog

    def matched_blocks(self, hashes: list[int]) -> int:
        """Leading blocks of a prompt this worker holds: the KV-event index (precise), or the
        prompts routed to it (approximate), whichever reaches further."""
        approx = self.approx_index.match_length(hashes)
        if self.event_index is None:
            return approx
        return max(approx, self.event_index.match_length(hashes))

    def start_events(self) -> None:
        """Follow the worker's KV events (a subscriber thread)."""
        if self.kv_events is None or self.subscriber is not None:
            return
        self.event_index = WorkerBlockIndex()
        self.subscriber = KVEventSubscriber(self.kv_events.endpoint, self.kv_events.replay, self.kv_events.topic,
                                            self.event_index).start()

    def forget_cache(self) -> None:
        """The worker restarted or left: what it held is gone."""
        self.approx_index.clear()
        if self.subscriber is not None:
            self.subscriber.reset()

    def stop_events(self) -> None:
        if self.subscriber is not None:
            self.subscriber.stop()
            self.subscriber = None
