"""The adaptive switch: which requests propose drafts, decided by the scheduler each step
(torch-free).

Verifying ``k`` drafts costs a step of ``1 + k`` tokens instead of ``1``. At batch 1 on a CPU a
step reads all the weights whatever its width, so drafts are nearly free; as the batch grows the
step costs more per row and every rejected draft token costs its share (measured break-even:
``docs/speculative_decoding.md``, ``docs/benchmarks.md`` section 5.3). Two switches::

    batch level:   more than disable_by_batch_size requests running  ->  nobody proposes
    per request:   recent acceptance < min_acceptance_rate           ->  the request pauses
                   (8 steps, doubling on each relapse up to 256), then tries again

Per-request acceptance is a decayed sum over its drafts (``DECAY`` per draft), judged once it
weighs ``MIN_EVIDENCE`` drafted tokens, so one unlucky draft does not switch a request off.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.config import SpeculativeConfig

DECAY = 0.8
MIN_EVIDENCE = 8.0
FIRST_PAUSE = 8
MAX_PAUSE = 256


@dataclass
class _RequestAcceptance:
    drafted: float = 0.0
    accepted: float = 0.0
    paused_until: int = -1  # step number
    pause: int = FIRST_PAUSE


class SpecDecodePolicy:
    """Args:
    config: the speculative config (its ``disable_by_batch_size`` and ``min_acceptance_rate``).
    """

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self.step = 0
        self._requests: dict[str, _RequestAcceptance] = {}

    def batch_allows(self, num_running: int) -> bool:
        """False while more than ``disable_by_batch_size`` requests run (then nobody proposes).
        Advances the policy's step clock: call once per scheduled step."""
        self.step += 1
        limit = self.config.disable_by_batch_size
        return limit == 0 or num_running <= limit

    def request_allows(self, request_id: str) -> bool:
        """False while the request is paused for low acceptance."""
        state = self._requests.get(request_id)
        return state is None or self.step >= state.paused_until

    def observe(self, request_id: str, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Record one verified draft; pause the request when its acceptance is too low."""
        threshold = self.config.min_acceptance_rate
        if threshold <= 0:
            return
        state = self._requests.setdefault(request_id, _RequestAcceptance())
        state.drafted = state.drafted * DECAY + num_draft_tokens
        state.accepted = state.accepted * DECAY + num_accepted_tokens
        if state.drafted < MIN_EVIDENCE:
            return
        if state.accepted < threshold * state.drafted:
            state.paused_until = self.step + state.pause
            state.pause = min(2 * state.pause, MAX_PAUSE)
            state.drafted = state.accepted = 0.0
        elif state.accepted >= 2 * threshold * state.drafted:
            state.pause = FIRST_PAUSE  # doing well again: the next relapse pauses briefly

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
