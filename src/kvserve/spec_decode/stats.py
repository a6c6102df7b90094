"""Speculative-decoding counters (torch-free): what the metrics layer, the log line and
``kvserve bench`` read. Names and meanings as vLLM's ``vllm/v1/spec_decode/metrics.py``:

- a *draft* is one request's proposal verified in one step (``num_drafts``);
- ``num_draft_tokens``: proposed tokens verified; ``num_accepted_tokens``: of those, accepted;
- ``num_accepted_tokens_per_pos[i]``: drafts whose token at position ``i`` was accepted.

acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts (the
target's own token counted, as vLLM's log line).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecDecodingStats:
    """Totals since start-up (a snapshot; :class:`SpecDecodingCounters` accumulates)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0.0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verified draft, the target's own token included (1.0 before any draft)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def minus(self, before: SpecDecodingStats) -> SpecDecodingStats:
        """The counts accumulated since ``before`` (an earlier snapshot)."""
        per_pos = tuple(a - (before.num_accepted_tokens_per_pos[i] if i < len(before.num_accepted_tokens_per_pos)
                             else 0) for i, a in enumerate(self.num_accepted_tokens_per_pos))
        return SpecDecodingStats(self.num_drafts - before.num_drafts,
                                 self.num_draft_tokens - before.num_draft_tokens,
                                 self.num_accepted_tokens - before.num_accepted_tokens, per_pos)


class SpecDecodingCounters:
    """Accumulates drafts as the scheduler verifies them.

    Args:
        num_speculative_tokens: ``k``, the number of positions counted.
    """

    def __init__(self, num_speculative_tokens: int):
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.per_pos = [0] * num_speculative_tokens

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One request's draft of ``num_draft_tokens`` (>= 1), of which the first
        ``num_accepted_tokens`` were accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.per_pos[i] += 1

    def snapshot(self) -> SpecDecodingStats:
        return SpecDecodingStats(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                                 tuple(self.per_pos))
