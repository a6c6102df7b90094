"""The small stats objects the engine emits for metrics, logs and traces (no metric code here).

Per step the output processor fills an :class:`IterationStats`; per finished choice the metrics
layer derives a :class:`FinishedRequestStats` from the front end's recorded times::

    arrival ──queue──► first scheduled ──prefill──► first token ──decode──► finished
       └────────────── TTFT ───────────────────────────┘
       └────────────────────────────── e2e ─────────────────────────────────┘

Counting rule for ``n > 1``: as vLLM v1, each choice is its own engine request, so it is counted
as one request (success counter, per-request histograms, prompt tokens once per choice since
each choice prefills its prompt). Aborts are counted per API request (one client disconnect).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.engine.output_processor import RequestState


@dataclass
class IterationStats:
    """What one engine step delivered to clients (filled by ``OutputProcessor.process_outputs``).

    Attributes:
        num_prompt_tokens: prompt tokens of the choices that got their first token in this step.
        num_generation_tokens: output tokens delivered in this step (all choices).
        time_to_first_tokens: seconds from arrival to first token, one per choice that got it.
        inter_token_latencies: seconds between a choice's previous and this step's token, one per
            choice that already had a token (vLLM's ITL).
        lora_tokens: adapter name -> [prompt tokens, generation tokens] of the above that belong
            to requests running with that LoRA adapter.
    """

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    lora_tokens: dict[str, list[int]] = field(default_factory=dict)
    num_cached_prompt_tokens: int = 0
    num_external_prompt_tokens: int = 0  # of the cached ones, loaded by the KV connector

    def add_lora_tokens(self, lora_name: str, num_prompt_tokens: int, num_generation_tokens: int) -> None:
        counts = self.lora_tokens.setdefault(lora_name, [0, 0])
        counts[0] += num_prompt_tokens
        counts[1] += num_generation_tokens


@dataclass(frozen=True)
class FinishedRequestStats:
    """One finished choice. Times are ``time.time()`` seconds; token counts are tokens.

    ``first_token_time`` falls back to finish and ``first_scheduled_time`` to the first token
    when the request never reached them (a request never scheduled was queued throughout), so
    every derived duration is defined and non-negative.
    """

    request_id: str
    finish_reason: str
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    arrival_time: float
    first_scheduled_time: float
    first_token_time: float
    finished_time: float
    num_preemptions: int = 0

    @property
    def queue_time(self) -> float:
        """Seconds from arrival to first scheduled."""
        return self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def prefill_time(self) -> float:
        """Seconds from first scheduled to first token."""
        return self.first_token_time - self.first_scheduled_time

    @property
    def decode_time(self) -> float:
        """Seconds from first token to finish."""
        return self.finished_time - self.first_token_time

    @property
    def e2e_latency(self) -> float:
        return self.finished_time - self.arrival_time

    @property
    def time_per_output_token(self) -> float:
        """TPOT = decode time / (generation tokens - 1); 0 with fewer than 2 tokens (as vLLM, so
        every finished request is observed once)."""
        if self.num_generation_tokens < 2:
            return 0.0
        return self.decode_time / (self.num_generation_tokens - 1)


def finished_request_stats(state: RequestState) -> list[FinishedRequestStats]:
    """One :class:`FinishedRequestStats` per finished choice of ``state`` (choice index order)."""
    result = []
    for child_id, choice in sorted(state.choices.items(), key=lambda item: item[1].index):
        if choice.finish_reason is None:
            continue
        times = choice.times or state.times
        finished = times.finished or state.times.finished or times.arrival
        first_token = times.first_token or finished
        first_scheduled = times.first_scheduled or first_token  # never scheduled: queued throughout
        result.append(FinishedRequestStats(
            request_id=child_id, finish_reason=choice.finish_reason,
            num_prompt_tokens=len(state.prompt_token_ids), num_generation_tokens=choice.num_output_tokens,
            num_cached_tokens=state.num_cached_tokens, arrival_time=times.arrival,
            first_scheduled_time=min(first_scheduled, first_token), first_token_time=first_token,
            finished_time=finished, num_preemptions=choice.num_preemptions,
        ))
    return result
