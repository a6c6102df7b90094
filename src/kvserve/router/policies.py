"""Routing policies: which routable worker gets a request.

Every policy implements :class:`RoutingPolicy` and registers under its ``--policy`` name:

==============  =============================================================================
round_robin     the next worker in turn
power_of_two    two workers drawn at random; the less loaded one (Mitzenmacher's two choices)
least_load      the least loaded worker (load = in flight + backlog, ``worker.py``)
cache_aware     the default; below
least_ttft      the lowest predicted time to first token (kvserve workers' own prediction)
==============  =============================================================================

``cache_aware`` (after SGLang's cache-aware router, with precise matches from KV events where the
worker publishes them, as llm-d's precise prefix scorer, and Dynamo's overlap-weighted cost)::

    P = prompt tokens, B = block size, L(w) = load of worker w, M(w) = tokens of the prompt's
    leading blocks w holds (KV-event index or routed-prompt index, at most (P-1)//B blocks)

    1. imbalanced = max L - min L > balance_abs_threshold  and  max L > balance_rel_threshold * min L
       -> least load (a hot worker is relieved whatever it caches)
    2. max_w M(w) / P < cache_threshold
       -> least load (nobody caches enough of it: spread new prefixes)
    3. otherwise the worker with the lowest
            cost(w) = (P - M(w)) + queue_token_cost * L(w)
       i.e. the prefill tokens it would still compute, plus queue_token_cost tokens per request
       it is already busy with. Ties: lower load, then turn.

With the defaults (thresholds 64 / 1.5 and 0.3 from SGLang's router, queue_token_cost 8), a
worker holding a 160-token shared prefix keeps its group until it has 20 more requests than
another worker (a 512-token one: until the imbalance guard); then the prefix is computed on a
second worker too (a hot prefix spreads). Why 8: under continuous batching a request a worker is
busy with costs a newcomer about one token of each step they share, not a queue slot; 8 leaves
room for steps with a waiting queue. Measured on the shared-prefix workload (docs/router.md): 64
(one queued request = 4 blocks) broke affinity at load gaps of 3 requests and kept 85% of a single
worker's hit rate; 8 kept it.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from kvserve.router.config import RouterConfig
from kvserve.router.prefix import hittable_blocks
from kvserve.router.worker import Worker
from kvserve.slo.scheduling import REFERENCE_PROMPT_TOKENS


@dataclass(frozen=True)
class RouteRequest:
    """What a policy knows of a request: its prompt's block hashes (None when the policy does not
    need them) and its prompt length in tokens."""

    hashes: list[int] | None
    num_tokens: int
    block_size: int = 16


@dataclass(frozen=True)
class Decision:
    """The chosen worker, the prompt tokens it is expected to hold, and why it was chosen
    (``turn``, ``load``, ``cache``, ``imbalance``, ``ttft``)."""

    worker: Worker
    matched_tokens: int
    reason: str


class RoutingPolicy(ABC):
    """Chooses among routable workers (never empty). Implementations keep only their own
    counters; worker state is read, never changed."""

    name: ClassVar[str]
    needs_prompt: ClassVar[bool] = False

    def __init__(self, config: RouterConfig, rng: random.Random | None = None):
        self.config = config
        self.rng = rng or random.Random()
        self._turn = 0

    @abstractmethod
    def select(self, workers: list[Worker], request: RouteRequest) -> Decision:
        """Pick one of ``workers`` (routable, at least one) for ``request``."""

    def _next_turn(self) -> int:
        self._turn += 1
        return self._turn - 1

    def _least_loaded(self, workers: list[Worker]) -> Worker:
        lowest = min(w.load for w in workers)
        tied = [w for w in workers if w.load == lowest]
        return tied[self._next_turn() % len(tied)]


_POLICIES: dict[str, type[RoutingPolicy]] = {}


def register_policy(cls: type[RoutingPolicy]) -> type[RoutingPolicy]:
    _POLICIES[cls.name] = cls
    return cls


def make_policy(name: str, config: RouterConfig, rng: random.Random | None = None) -> RoutingPolicy:
    """The policy registered as ``name``.

    Raises:
        ValueError: no such policy (the message lists them).
    """
    if name not in _POLICIES:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(sorted(_POLICIES))}")
    return _POLICIES[name](config, rng)


@register_policy
class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"

    def select(self, workers, request):
        return Decision(workers[self._next_turn() % len(workers)], 0, "turn")


@register_policy
class PowerOfTwoPolicy(RoutingPolicy):
    name = "power_of_two"

    def select(self, workers, request):
        if len(workers) == 1:
            return Decision(workers[0], 0, "load")
        a, b = self.rng.sample(workers, 2)
        return Decision(a if a.load <= b.load else b, 0, "load")


@register_policy
class LeastLoadPolicy(RoutingPolicy):
    name = "least_load"

    def select(self, workers, request):
        return Decision(self._least_loaded(workers), 0, "load")


@register_policy
class LeastTTFTPolicy(RoutingPolicy):
    """The worker whose predicted TTFT for this prompt is lowest. Each kvserve worker publishes
    the TTFT its scheduler predicts for a 128-token prompt arriving behind its queue
    (``slo_predicted_ttft_seconds``, from its own step-cost model) and its seconds per prompt
    token; the router adds ``(P - 128)`` prompt tokens and, for each request it sent since the
    scrape, 128 more. Ties, or any worker without a prediction (another engine, a cost model not
    ready): least load."""

    name = "least_ttft"

    def select(self, workers, request):
        if any(w.load_snapshot.predicted_ttft is None or w.load_snapshot.prefill_token_cost is None for w in workers):
            return Decision(self._least_loaded(workers), 0, "load")
        predicted = [self.predicted_ttft(w, request.num_tokens) for w in workers]
        best = min(predicted)
        tied = [w for w, p in zip(workers, predicted) if p == best]
        return Decision(tied[0] if len(tied) == 1 else self._least_loaded(tied), 0, "ttft")

    @staticmethod
    def predicted_ttft(worker: Worker, num_tokens: int) -> float:
        snap = worker.load_snapshot
        sent_since = max(0, worker.in_flight - snap.in_flight_at_scrape)
        reference = REFERENCE_PROMPT_TOKENS
        return snap.predicted_ttft + (num_tokens - reference + reference * sent_since) * snap.prefill_token_cost


@register_policy
class CacheAwarePolicy(RoutingPolicy):
    name = "cache_aware"
    needs_prompt = True

    def select(self, workers, request):
        loads = [w.load for w in workers]
        most, least = max(loads), min(loads)
        cfg = self.config
        if most - least > cfg.balance_abs_threshold and most > cfg.balance_rel_threshold * least:
            return Decision(self._least_loaded(workers), 0, "imbalance")
        hashes = (request.hashes or [])[:hittable_blocks(request.num_tokens, request.block_size)]
        matched = [w.matched_blocks(hashes) * request.block_size for w in workers]
        if not hashes or max(matched) < cfg.cache_threshold * request.num_tokens:
            chosen = self._least_loaded(workers)
            return Decision(chosen, matched[workers.index(chosen)], "load")
        costs = [(request.num_tokens - m) + cfg.queue_token_cost * w.load for w, m in zip(workers, matched)]
        best = min(costs)
        tied = [i for i, c in enumerate(costs) if c == best]
        lowest = min(loads[i] for i in tied)
        tied = [i for i in tied if loads[i] == lowest]
        index = tied[self._next_turn() % len(tied)]
        return Decision(workers[index], matched[index], "cache")
