"""The plan of one engine step: what the scheduler sends to the model runner.

The runner keeps a persistent batch (``kvserve.model.input_batch.InputBatch``), so a request's
data crosses once, when the runner first sees it, and each later step sends only what changed
(after vLLM v1's ``NewRequestData`` / ``CachedRequestData``)::

    step k:   new:    r7 (prompt, params, block table [4, 9], computed 0)   num_scheduled r7: 37
              cached: r3 (new blocks [], computed 120)                      num_scheduled r3: 1
    step k+1: cached: r7 (new blocks [12], computed 37), r3 (new blocks [], computed 121)

With speculative decoding a running request carries draft tokens (``Request.spec_token_ids``,
proposed by the runner after the previous step); it is scheduled ``1 + num_drafts`` tokens and
the drafts it gets travel in ``scheduled_spec_decode_tokens`` (vLLM's name)::

    step k:   cached: r3 (computed 121)   num_scheduled r3: 4   spec tokens r3: [d1, d2, d3]
              -> the runner computes [t121, d1, d2, d3] in one forward and verifies the drafts

A request preempted in a step leaves the runner's batch (``preempted_req_ids``) and comes back as
new data, with the tokens it generated so far, when it is scheduled again. The runner appends the
token it samples for a request to its own copy of the request's tokens, so tokens never travel
back from the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvserve.request import Request

if TYPE_CHECKING:
    from kvserve.engine.engine_request import EngineRequest
    from kvserve.kv_transfer.scheduling import ExternalBlocks


@dataclass(frozen=True)
class NewRequestData:
    """A request the runner does not hold yet: first scheduled, or resumed after preemption.

    Attributes:
        spec: the request's frozen spec (``EngineRequest``: id, prompt, sampling parameters with
            the resolved ``max_tokens`` (0 = it only scores its prompt), EOS ids, bad words,
            grammar, adapter), referenced as the scheduler holds it.
        output_token_ids: tokens generated before a preemption (empty for a new request); the
            runner's tokens are ``spec.prompt_token_ids + output_token_ids``.
        block_ids: its whole block table.
        num_computed_tokens: tokens whose K/V are already in the cache (a prefix-cache hit).
    """

    spec: EngineRequest
    output_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int

    @property
    def req_id(self) -> str:
        return self.spec.request_id

    @classmethod
    def from_request(cls, request: Request, block_ids: list[int]) -> NewRequestData:
        return cls(request.spec, list(request.output_token_ids), block_ids, request.num_computed_tokens)


@dataclass(frozen=True)
class CachedRequestData:
    """Per-step deltas of requests the runner already holds (parallel lists, in batch order).

    Attributes:
        req_ids: the requests.
        new_block_ids: per request, blocks appended to its table since the last step (usually
            none: a block holds ``block_size`` tokens).
        num_computed_tokens: per request, tokens whose K/V are in the cache before this step.
    """

    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's plan. The runner computes, for each scheduled request, tokens
    ``[num_computed_tokens, num_computed_tokens + num_scheduled_tokens[req_id])`` of its known
    tokens and samples a token when that reaches the end of them (unless ``max_tokens == 0``).

    Attributes:
        scheduled_new_reqs: requests the runner sees for the first time (or again after a
            preemption).
        scheduled_cached_reqs: deltas of requests it already holds.
        num_scheduled_tokens: request id -> tokens to compute this step (every scheduled request).
        total_num_scheduled_tokens: their sum.
        finished_req_ids: requests finished or aborted since the last step: the runner drops all
            their state (generators included).
        preempted_req_ids: requests preempted in this step: the runner drops their batch rows
            but keeps their random generator (a seeded request continues its stream).
        scheduled_spec_decode_tokens: request id -> the draft tokens to verify this step (the
            last ``len(drafts)`` of its scheduled tokens); requests without drafts are absent.
        propose_draft_req_ids: requests for which the runner proposes drafts after sampling this
            step (the adaptive switch's choice; empty without speculative decoding).
        kv_loads: blocks the KV connector read for newly admitted requests: the engine writes them
            into the cache before the forward (``kvserve.kv_transfer``; empty without one).
    """

    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    propose_draft_req_ids: frozenset[str] = frozenset()
    kv_loads: list[ExternalBlocks] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0
