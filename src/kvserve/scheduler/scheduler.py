"""Continuous batching: which requests compute how many tokens in the next engine step.

There are no prefill and decode phases: a request has ``num_computed_tokens`` against its known
tokens (prompt + output), and a step computes up to ``num_tokens - num_computed_tokens`` of them
(a whole prompt, a chunk of it, or the one decode token). One step spends a token budget::

    budget = max_num_batched_tokens
    1. RUNNING requests: decodes first (1 token each, or 1 + its draft tokens with speculative
       decoding: ``kvserve.scheduler.spec_decode``), then unfinished chunked prefills (capped by
       the budget and long_prefill_token_threshold), so a long prompt never stalls a decode.
       allocate_slots() -> None: preempt (recompute) the lowest-priority / latest running request
       and retry; if that victim is the request itself, stop.
    2. WAITING requests in policy order (only when step 1 preempted nobody): prefix-cache lookup,
       then the blocks after the hit that the KV connector can load (``kvserve.kv_transfer``:
       allocated, read, written before the forward), then the rest of the prompt (chunked when it exceeds the remaining budget) while
       max_num_seqs and the KV cache allow. Under ``priority`` a waiting request may preempt
       running requests of lower priority. With LoRA, a request whose adapter would be one more
       than ``max_loras`` among running requests waits (in its place) while later ones go; so
       does a request without a TPOT target while such requests hold their share of the rows
       that recent TPOT targets leave (``kvserve.slo.scheduling``).

Method after vLLM v1's ``Scheduler`` (recompute preemption; preempted requests resume first).
Applying a step's results (``update_from_output``) and finishing requests are in
``kvserve.scheduler.updates``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvserve.config import SchedulerConfig, SpeculativeConfig
from kvserve.kv_cache.block import KVCacheBlock
from kvserve.kv_cache.manager import KVCacheManager
from kvserve.kv_transfer.scheduling import ExternalBlocks, ExternalKV
from kvserve.request import Request, RequestStatus
from kvserve.scheduler.admission import check_kv_fit, check_queue_capacity
from kvserve.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput
from kvserve.scheduler.prompt_logprobs import PromptLogprobsTracker
from kvserve.scheduler.request_queue import create_request_queue
from kvserve.scheduler.spec_decode import SpecDecodeScheduling
from kvserve.scheduler.stats import LoRAStats, SchedulerStats
from kvserve.scheduler.updates import StepUpdates
from kvserve.slo.scheduling import SLOScheduling


@dataclass
class _StepPlan:
    """The step being built: remaining budget, tokens per request in batch order, victims."""

    token_budget: int
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted: dict[str, Request] = field(default_factory=dict)
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)
    kv_loads: list[ExternalBlocks] = field(default_factory=list)


class Scheduler(StepUpdates):
    """Plans engine steps over one KV-cache manager.

    Args:
        scheduler_config: budgets and policy.
        kv_cache_manager: the block tables; the scheduler is its only user.
        speculative_config: speculative decoding, or None.
        max_loras: most distinct LoRA adapters among running requests (``--max-loras``; 0 = LoRA
            off).

    Raises:
        ValueError: chunked prefill is off but ``max_num_batched_tokens < max_model_len`` (a
            prompt could never be scheduled).
    """

    def __init__(self, scheduler_config: SchedulerConfig, kv_cache_manager: KVCacheManager,
                 speculative_config: SpeculativeConfig | None = None, max_loras: int = 0):
        cfg = scheduler_config
        if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
            raise ValueError(
                f"with chunked prefill off, max_num_batched_tokens ({cfg.max_num_batched_tokens}) "
                f"must be >= max_model_len ({cfg.max_model_len})"
            )
        self.scheduler_config = cfg
        self.kv_cache_manager = kv_cache_manager
        self.waiting = create_request_queue(cfg.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()
        # Request id -> how many of its block ids the runner holds (absent: the runner does not
        # hold the request, so its next scheduling sends it whole as NewRequestData).
        self.num_sent_block_ids: dict[str, int] = {}
        self.prompt_logprobs_tracker = PromptLogprobsTracker()
        self.spec = None if speculative_config is None else SpecDecodeScheduling(speculative_config, cfg.max_model_len)
        self.max_loras = max_loras
        self.slo = SLOScheduling()
        self.external_kv: ExternalKV | None = None  # KV from outside the pool (kvserve.kv_transfer)
        self._init_counters()

    def _init_counters(self) -> None:
        self.num_preemptions = 0
        self.num_steps = 0
        self.num_scheduled_tokens = 0
        self.num_generated_tokens = 0
        self.num_finished_requests = 0
        self.deferred_ids: set[str] = set()  # passed over by the last step's admission (metrics)

    # -- admission -----------------------------------------------------------------------------

    def add_requests(self, requests: list[Request], capacity_param: str | None = None) -> None:
        """Queue requests (status WAITING) as one unit: all of them or, when it raises, none.

        The input processor has validated each request; the scheduler checks only what depends
        on its own state: the KV cache can hold each request at all, and the waiting queue has
        room for all of them.

        Args:
            requests: the choices of one call's prompts.
            capacity_param: the request field to blame when they could never fit the queue
                (``prompt`` for many prompts, ``n`` for many choices).

        Raises:
            ValueError: a request id already in use or repeated (the caller's bug).
            InvalidRequestError: a request needs more KV blocks than the whole cache has, or the
                requests could never fit the queue (see ``check_queue_capacity``).
            RequestRejectedError: ``reason="queue_full"`` when they do not fit the queue now;
                ``reason="slo_unattainable"`` when a request's latency targets are predicted to be
                missed and it asked to be refused then (``kvserve.slo.scheduling``).
        """
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids) or any(i in self.requests for i in ids):
            raise ValueError(f"request ids must be new and distinct, got {ids}")
        for request in requests:
            check_kv_fit(request, self.kv_cache_manager)
        check_queue_capacity(len(self.waiting), len(self.running), self.scheduler_config, len(requests),
                             param=capacity_param)
        self.slo.admit(requests, self)
        for request in requests:
            request.status = RequestStatus.WAITING
            self.requests[request.request_id] = request
            self.waiting.add(request)
            if self.external_kv is not None:
                self.external_kv.prefetch(request, len(self.kv_cache_manager.get_computed_blocks(request).blocks))

    def add_request(self, request: Request) -> None:
        """Queue one request (see :meth:`add_requests`)."""
        self.add_requests([request])

    # -- planning ------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan the next step (see the module docstring). Requests' ``num_computed_tokens`` are
        advanced later, by ``update_from_output``."""
        plan = _StepPlan(self.slo.token_budget(self.running, self.scheduler_config.max_num_batched_tokens))
        self._schedule_running(plan)
        if not plan.preempted:
            self._schedule_waiting(plan)
        if self.spec is not None:  # the batch switch judges the batch this step runs
            self.spec.start_step(len(self.running))
        return self._make_output(plan)

    def _num_new_tokens(self, request: Request, num_computed: int, token_budget: int) -> int:
        num_new = request.num_tokens - num_computed
        threshold = self.scheduler_config.long_prefill_token_threshold
        if threshold > 0 and self.scheduler_config.enable_chunked_prefill:
            num_new = min(num_new, threshold)
        return min(num_new, token_budget)

    def _schedule_running(self, plan: _StepPlan) -> None:
        decodes, prefills = [], []
        for r in self.running:
            (decodes if len(r.all_token_ids) - r.num_computed_tokens == 1 else prefills).append(r)
        scheduled = plan.num_scheduled_tokens
        running = RequestStatus.RUNNING
        block_ids = self.kv_cache_manager.req_to_block_ids
        block_size = self.kv_cache_manager.block_size
        spec = self.spec
        for request in decodes:  # the common case, kept lean: one token each (+ its drafts)
            if plan.token_budget == 0:
                return
            if request.status is not running:  # preempted earlier in this step
                continue
            request_id = request.request_id
            if spec is None and request.num_computed_tokens < len(block_ids[request_id]) * block_size:
                scheduled[request_id] = 1  # its last block has room: nothing to allocate
                plan.token_budget -= 1
                continue
            num_new = min(1 + len(request.spec_token_ids), plan.token_budget)
            if not self._allocate_or_preempt(request, num_new, plan):
                return
            scheduled[request_id] = num_new
            plan.token_budget -= num_new
            if request.spec_token_ids:
                drafts = spec.take_drafts(request, num_new)
                if drafts:
                    plan.spec_tokens[request_id] = drafts
        for request in prefills:
            if plan.token_budget == 0:
                break
            if request.status != RequestStatus.RUNNING:
                continue
            num_new = self._num_new_tokens(request, request.num_computed_tokens, plan.token_budget)
            if num_new <= 0:
                continue
            if not self._allocate_or_preempt(request, num_new, plan):
                break
            scheduled[request.request_id] = num_new
            plan.token_budget -= num_new

    def _allocate_or_preempt(self, request: Request, num_new: int, plan: _StepPlan) -> bool:
        """Allocate for a running request, preempting others until it fits (False: it was the
        victim itself)."""
        lookahead = self._lookahead(request, request.num_computed_tokens + num_new)
        while self.kv_cache_manager.allocate_slots(request, num_new, num_lookahead_tokens=lookahead) is None:
            victim = self._select_victim()
            self._preempt(victim, plan)
            if victim is request:
                return False
        return True

    def _lookahead(self, request: Request, end: int) -> int:
        return 0 if self.spec is None else self.spec.lookahead(request, end)

    def _select_victim(self) -> Request:
        if self.scheduler_config.policy == "priority":
            # Largest (priority, arrival_time) loses; ties go to the latest admitted.
            return max(reversed(self.running), key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, victim: Request, plan: _StepPlan) -> None:
        self.running.remove(victim)
        self.kv_cache_manager.free(victim)
        self.num_sent_block_ids.pop(victim.request_id, None)
        # A victim already planned in this step gives its tokens back.
        plan.token_budget += plan.num_scheduled_tokens.pop(victim.request_id, 0)
        plan.spec_tokens.pop(victim.request_id, None)
        victim.status = RequestStatus.PREEMPTED
        if self.spec is not None:
            self.spec.forget(victim)  # drafts dropped; they are proposed again after it resumes
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(victim)
        plan.preempted[victim.request_id] = victim

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        max_num_seqs = self.scheduler_config.max_num_seqs
        in_flight = self._in_flight_block_hashes()
        adapters = self._running_adapters()
        deferred: list[Request] = []
        while self.waiting and plan.token_budget > 0 and len(self.running) < max_num_seqs:
            request = self.waiting.peek()
            if request.request_id in plan.preempted:
                break  # preempted in this very step: memory is short, resume next step
            if adapters is not None and self._adapter_full(request, adapters) \
                    or not self.slo.may_start(request):
                deferred.append(self.waiting.pop())
                continue
            hit_blocks, num_cached = self.kv_cache_manager.get_computed_blocks(request)
            if self._next_block_in_flight(request, len(hit_blocks), in_flight):
                deferred.append(self.waiting.pop())
                continue
            external = 0 if self.external_kv is None else self.external_kv.num_tokens(request, len(hit_blocks))
            if self.scheduler_config.enable_chunked_prefill:
                num_new = self._num_new_tokens(request, num_cached + external, plan.token_budget)
            else:
                num_new = request.num_tokens - num_cached - external
                if num_new > plan.token_budget:
                    break
            if not self._admit(request, num_new, hit_blocks, num_cached, plan, external):
                break
            in_flight.update(self._uncomputed_prompt_hashes(request))
            if adapters is not None and request.lora_request is not None:
                adapters.add(request.lora_request)
        for request in reversed(deferred):  # back in their place: preempted ones at the head, the others by key
            if request.status == RequestStatus.PREEMPTED:
                self.waiting.prepend(request)
            else:
                self.waiting.add(request)
        self.deferred_ids = {r.request_id for r in deferred}

    def _running_adapters(self) -> set | None:
        """The adapters of running requests (None without LoRA)."""
        if self.max_loras == 0:
            return None
        return {r.lora_request for r in self.running if r.lora_request is not None}

    def _adapter_full(self, request: Request, adapters: set) -> bool:
        """True when admitting ``request`` would run more than ``max_loras`` adapters."""
        lora = request.lora_request
        return lora is not None and lora not in adapters and len(adapters) >= self.max_loras

    # -- cache-aware admission ---------------------------------------------------------------
    #
    # Requests that share a prompt prefix often arrive together (n > 1, a system prompt). If the
    # second were admitted while the first is still computing the shared blocks, it would find no
    # cached block and compute the same prefix again. Such a request waits (in its place at the
    # head of the queue) until the blocks are in the prefix cache, usually one step; requests
    # behind it are scheduled meanwhile.

    def _uncomputed_prompt_hashes(self, request: Request) -> list[int]:
        block_size = self.kv_cache_manager.block_size
        first = request.num_computed_tokens // block_size
        return request.block_hashes[first : request.num_prompt_tokens // block_size]

    def _in_flight_block_hashes(self) -> set[int]:
        """Hashes of full prompt blocks that running requests are still computing."""
        if not self.kv_cache_manager.enable_caching:
            return set()
        in_flight: set[int] = set()
        for request in self.running:
            if request.num_computed_tokens < request.num_prompt_tokens:
                in_flight.update(self._uncomputed_prompt_hashes(request))
        return in_flight

    @staticmethod
    def _next_block_in_flight(request: Request, num_hit_blocks: int, in_flight: set[int]) -> bool:
        """True when the first block ``request`` would compute is being computed by another."""
        hashes = request.block_hashes
        return bool(in_flight) and num_hit_blocks < len(hashes) and hashes[num_hit_blocks] in in_flight

    def _admit(self, request: Request, num_new: int, hit_blocks: list[KVCacheBlock], num_cached: int,
               plan: _StepPlan, external: int = 0) -> bool:
        """Allocate for the head of waiting and move it to running (False: it must wait).
        ``external``: tokens after the hit that the KV connector loads (allocated here too)."""
        kv = self.kv_cache_manager
        lookahead = self._lookahead(request, num_cached + external + num_new)
        while kv.allocate_slots(request, external + num_new, hit_blocks, num_cached, lookahead) is None:
            victim = self._select_victim_for_waiting(request)
            if victim is None:
                return False
            self._preempt(victim, plan)
        popped = self.waiting.pop()
        assert popped is request, f"waiting head changed from {request.request_id} to {popped.request_id}"
        request.status = RequestStatus.RUNNING
        if self.external_kv is not None:
            num_cached += self._load_external(request, len(hit_blocks), external, plan)
        request.num_computed_tokens = num_cached
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_cached
            request.num_external_tokens = num_cached - len(hit_blocks) * kv.block_size
        request.first_scheduled_time = request.first_scheduled_time or time.time()  # metrics: queue time ends
        self.running.append(request)
        plan.num_scheduled_tokens[request.request_id] = num_new
        plan.token_budget -= num_new
        return True

    def _load_external(self, request: Request, num_hit_blocks: int, external: int, plan: _StepPlan) -> int:
        """Read the connector's blocks into the request's new blocks (the step loads them before
        its forward); returns the tokens read (fewer than ``external`` when a block could not be:
        the rest is computed, the step's tokens starting earlier)."""
        if not external:
            self.external_kv.count_miss(request, num_hit_blocks)
            return 0
        blocks = self.external_kv.read(request, self.kv_cache_manager.req_to_block_ids[request.request_id],
                                       num_hit_blocks, external)
        if blocks.block_ids:
            plan.kv_loads.append(blocks)
        return len(blocks.block_ids) * self.kv_cache_manager.block_size

    def _select_victim_for_waiting(self, request: Request) -> Request | None:
        """Under ``priority``, the running request with strictly lower priority than ``request``
        (larger ``(priority, arrival_time)``) that loses first; else None (fcfs never preempts for
        a waiting request)."""
        if self.scheduler_config.policy != "priority" or not self.running:
            return None
        victim = self._select_victim()
        if (victim.priority, victim.arrival_time) > (request.priority, request.arrival_time):
            return victim
        return None

    def _make_output(self, plan: _StepPlan) -> SchedulerOutput:
        """New requests' data once, deltas (new block ids, computed tokens) for the others."""
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        kv = self.kv_cache_manager
        for request_id in plan.num_scheduled_tokens:
            request = self.requests[request_id]
            block_ids = kv.req_to_block_ids[request_id]
            num_sent = self.num_sent_block_ids.get(request_id)
            if num_sent is None:
                new_reqs.append(NewRequestData.from_request(request, list(block_ids)))
            else:
                cached.req_ids.append(request_id)
                cached.new_block_ids.append(block_ids[num_sent:])
                cached.num_computed_tokens.append(request.num_computed_tokens)
            self.num_sent_block_ids[request_id] = len(block_ids)
        total = sum(plan.num_scheduled_tokens.values())
        if total:
            self.num_steps += 1
            self.num_scheduled_tokens += total
        finished, self.finished_req_ids = self.finished_req_ids, set()
        propose = frozenset()
        if self.spec is not None:
            requests = self.requests
            propose = frozenset(r for r, n in plan.num_scheduled_tokens.items()
                                if self.spec.proposes(requests[r], requests[r].num_computed_tokens + n))
        return SchedulerOutput(new_reqs, cached, plan.num_scheduled_tokens, total, finished, set(plan.preempted),
                               plan.spec_tokens, propose, plan.kv_loads)

    # -- queries -------------------------------------------------------------------------------

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def make_stats(self) -> SchedulerStats:
        """A snapshot for the metrics layer."""
        prefix = self.kv_cache_manager.stats
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_deferred=sum(1 for rid in self.deferred_ids if rid in self.requests
                             and self.requests[rid].status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_queries=prefix.queries,
            prefix_cache_hits=prefix.hits,
            num_preemptions=self.num_preemptions,
            num_steps=self.num_steps,
            num_scheduled_tokens=self.num_scheduled_tokens,
            num_generated_tokens=self.num_generated_tokens,
            num_finished_requests=self.num_finished_requests,
            spec_decoding=None if self.spec is None else self.spec.stats(),
            lora=self._lora_stats(),
            slo=self.slo.stats(self),
            kv_transfer=None if self.external_kv is None else self.external_kv.connector.stats(self.external_kv.stats),
        )

    def _lora_stats(self) -> LoRAStats | None:
        if self.max_loras == 0:
            return None
        counts: tuple[dict[str, int], dict[str, int]] = ({}, {})
        for requests, count in ((self.running, counts[0]), (self.waiting, counts[1])):
            for request in requests:
                if request.lora_request is not None:
                    name = request.lora_request.lora_name
                    count[name] = count.get(name, 0) + 1
        return LoRAStats(self.max_loras, *counts)
