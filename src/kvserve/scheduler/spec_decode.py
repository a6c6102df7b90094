"""The scheduler's side of speculative decoding (torch-free): draft tokens on requests, how many
are scheduled, the correction of ``num_computed_tokens`` after verification, and the counters.

One request over two steps, ``k = 3``::

    after step t:    tokens [.. t9]            drafts from the runner [d1 d2 d3]
                     (trimmed so that 1 + drafts never passes max_tokens or max_model_len)
    schedule t+1:    1 + 3 tokens: [t9 d1 d2 d3]  (fewer when the budget is short)
    runner:          accepts d1, rejects d2, samples its own x  -> sampled [d1 x]
    update:          num_computed += 4 - (3 - 1) rejected; tokens [.. t9 d1 x]

Rejected positions were computed into the request's own blocks but are not counted as
computed: the next step overwrites them, and ``cache_blocks`` only ever registers blocks full of
computed tokens, so they never reach the prefix cache. A preempted request's drafts are dropped.
"""

from __future__ import annotations

from kvserve.config import SpeculativeConfig
from kvserve.request import Request
from kvserve.spec_decode.policy import SpecDecodePolicy
from kvserve.spec_decode.stats import SpecDecodingCounters, SpecDecodingStats


class SpecDecodeScheduling:
    """Args:
    config: the speculative config.
    max_model_len: context length (drafts never reach past it).
    """

    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config = config
        self.max_model_len = max_model_len
        self.policy = SpecDecodePolicy(config)
        self.counters = SpecDecodingCounters(config.num_speculative_tokens)
        self.num_lookahead_tokens = config.num_speculative_tokens if config.method == "draft_model" else 0
        self._batch_allows = True

    def start_step(self, num_running: int) -> None:
        """Once per ``schedule()``, with the number of requests running in the step planned (the
        batch switch judges it; the draft model's lookahead slots, allocated while planning, follow
        the previous step's judgement: slots too many are harmless, too few only shorten drafts)."""
        self._batch_allows = self.policy.batch_allows(num_running)

    def proposes(self, request: Request, end: int) -> bool:
        """Whether ``request``, scheduled up to token ``end`` this step, proposes drafts after it:
        it samples (``end`` reaches its known tokens), has room for more than one further token,
        and the switches allow it."""
        return (self._batch_allows and end >= request.num_tokens
                and request.max_tokens - request.num_output_tokens > 2
                and self.policy.request_allows(request.request_id))

    def lookahead(self, request: Request, end: int) -> int:
        """Slots to allocate past ``end`` for the draft model's K/V of its own drafts."""
        if not self.num_lookahead_tokens or not self.proposes(request, end):
            return 0
        return max(0, min(self.num_lookahead_tokens, self.max_model_len - end))

    @staticmethod
    def take_drafts(request: Request, num_new: int) -> list[int]:
        """The drafts scheduled with ``num_new`` tokens of a decoding request (the first
        ``num_new - 1``); the request's own list is emptied (new drafts come after the step)."""
        drafts = request.spec_token_ids[: num_new - 1]
        request.spec_token_ids = []
        return drafts

    def num_rejected(self, request: Request, drafts: list[int], num_sampled: int) -> int:
        """Record a verification (``num_sampled`` tokens came back: the accepted drafts and the
        target's own) and return how many scheduled positions were rejected."""
        num_accepted = max(0, min(len(drafts), num_sampled - 1))
        self.counters.observe_draft(len(drafts), num_accepted)
        self.policy.observe(request.request_id, len(drafts), num_accepted)
        return len(drafts) - num_accepted

    def store_drafts(self, request: Request, drafts: list[int]) -> None:
        """Keep the runner's new drafts on a running request, trimmed so that the next step's
        ``1 + len(drafts)`` tokens never pass ``max_tokens`` nor ``max_model_len``."""
        room = min(request.max_tokens - request.num_output_tokens, self.max_model_len - request.num_tokens) - 1
        request.spec_token_ids = list(drafts[: max(0, min(room, self.config.num_speculative_tokens))])

    def forget(self, request: Request) -> None:
        """A request left (finished or preempted): drop its drafts (and, when finished, its
        acceptance history)."""
        request.spec_token_ids = []
        if request.is_finished:
            self.policy.forget(request.request_id)

    def stats(self) -> SpecDecodingStats:
        return self.counters.snapshot()
