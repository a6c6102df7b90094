"""Prompt logprobs returned once per position, even when preemption makes a prompt be recomputed."""

from __future__ import annotations

from kvserve.outputs import TokenLogprobs
from kvserve.request import Request


class PromptLogprobsTracker:
    """Remembers, per request, up to which prompt position logprobs were returned.

    A step that computes tokens ``[c, c + n)`` yields entries for prompt positions
    ``max(c, 1) .. min(c + n, num_prompt_tokens) - 1`` (position 0 has no context). After a
    preemption (recompute) the runner scores the same positions again; only new ones pass::

        returned so far:  pos 1 .. 5          preempted, recomputed: pos 1 .. 8
        passed on now:                 6 .. 8
    """

    def __init__(self) -> None:
        self._num_sent: dict[str, int] = {}

    def filter(self, request: Request, entries: list[TokenLogprobs] | None) -> list[TokenLogprobs] | None:
        """The entries not returned before, given ``request.num_computed_tokens`` already advanced
        past this step; ``None`` when nothing is new."""
        if entries is None:
            return None
        end = min(request.num_computed_tokens, request.num_prompt_tokens)
        first_position = end - len(entries)
        num_sent = self._num_sent.get(request.request_id, 1)
        self._num_sent[request.request_id] = max(num_sent, end)
        skip = max(0, num_sent - first_position)
        if skip == 0:
            return entries
        return entries[skip:] or None

    def forget(self, request_id: str) -> None:
        """Drop a finished request's state."""
        self._num_sent.pop(request_id, None)
