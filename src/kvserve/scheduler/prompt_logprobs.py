"""Prompt logprobs returned once per position, even when preemption makes a prompt be recomputed."""

from __future__ import annotations

from kvserve.outputs import PromptLogprobsChunk, TokenLogprobs


class PromptLogprobsTracker:
    """Remembers, per request, up to which prompt position logprobs were returned. The runner says
    which positions its entries score (``PromptLogprobsChunk.first_position``); after a preemption
    (recompute) it scores the same positions again and only new ones pass::

        returned so far:  pos 1 .. 5          preempted, recomputed: pos 1 .. 8
        passed on now:                 6 .. 8
    """

    def __init__(self) -> None:
        self._num_sent: dict[str, int] = {}

    def filter(self, request_id: str, scored: PromptLogprobsChunk | None) -> list[TokenLogprobs] | None:
        """The entries of ``scored`` not returned before; ``None`` when nothing is new."""
        if scored is None:
            return None
        first_position, entries = scored
        num_sent = self._num_sent.get(request_id, 1)
        self._num_sent[request_id] = max(num_sent, first_position + len(entries))
        skip = max(0, num_sent - first_position)
        if skip == 0:
            return entries
        return entries[skip:] or None

    def forget(self, request_id: str) -> None:
        """Drop a finished request's state."""
        self._num_sent.pop(request_id, None)
