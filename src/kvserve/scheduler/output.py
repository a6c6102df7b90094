"""The plan of one engine step, produced by the scheduler and executed by the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.request import Request


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step.

    The runner computes tokens ``request.all_token_ids[c : c + num_new_tokens]`` at positions
    ``c .. c + num_new_tokens - 1`` where ``c = num_computed_tokens`` (the value *before* this step;
    the scheduler advances the request's counter after the runner returns), writing their K/V into
    the slots given by ``block_ids``. It samples a token when ``c + num_new_tokens ==
    request.num_tokens`` (the request reached the end of its known tokens), unless the request
    generates no token at all (``max_tokens == 0``: it only scores its prompt).

    Attributes:
        request: the request (same process: a reference, not a copy).
        num_computed_tokens: tokens whose K/V are already in the cache.
        num_new_tokens: tokens to compute this step (a prefill chunk or 1 decode token).
        block_ids: the request's whole block table, KV block ids in order.
    """

    request: Request
    num_computed_tokens: int
    num_new_tokens: int
    block_ids: list[int]

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def samples(self) -> bool:
        return (self.num_computed_tokens + self.num_new_tokens >= self.request.num_tokens
                and self.request.max_tokens > 0)


@dataclass
class SchedulerOutput:
    """Attributes:
    scheduled: requests of this step, in batch order.
    total_num_scheduled_tokens: sum of ``num_new_tokens``.
    finished_request_ids: requests finished or aborted since the last step (the runner drops
        their per-request state, e.g. random generators).
    preempted_request_ids: requests preempted in this step (their K/V is gone; recomputed later).
    """

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    total_num_scheduled_tokens: int = 0
    finished_request_ids: set[str] = field(default_factory=set)
    preempted_request_ids: set[str] = field(default_factory=set)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0
