"""Log consumers: a periodic one-line engine summary and per-request access lines.

Both are stats consumers (see :class:`kvserve.metrics.wiring.StatsConsumer`) running on the
engine thread. The summary is written at the first step after ``interval`` seconds have passed
since the previous one, and only when something happened in between (tokens, preemptions or
queued work); an idle engine logs nothing, and a window that starts after an idle interval
starts at its first step. Structured fields go in the record's ``extra`` so the JSON
format (:mod:`kvserve.metrics.log_format`) carries them as keys.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvserve.metrics.prometheus import rejection_reason
from kvserve.metrics.stats import IterationStats, finished_request_stats
from kvserve.scheduler.stats import SchedulerStats
from kvserve.spec_decode.stats import SpecDecodingStats

logger = logging.getLogger("kvserve.stats")
request_logger = logging.getLogger("kvserve.requests")


@dataclass(frozen=True)
class IntervalSummary:
    """What one summary line reports.

    Attributes:
        prompt_throughput, generation_throughput: tokens per second over the interval.
        num_running, num_waiting: requests, at the interval's last step.
        kv_cache_usage: fraction 0-1, at the last step.
        prefix_cache_hit_rate: hit tokens / queried tokens over the interval (0 when none).
        num_preemptions: preemptions during the interval.
        spec_decoding: speculative-decoding counts over the interval (since the previous summary,
            as vLLM's ``SpecDecodingLogging``), or None when off. The line shows the acceptance
            rate, the mean acceptance length and, per draft position, the share of drafts
            accepted there; an interval without drafts shows none of it.
    """

    prompt_throughput: float
    generation_throughput: float
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float
    num_preemptions: int
    spec_decoding: SpecDecodingStats | None = None

    def format(self) -> str:
        line = (f"Avg prompt throughput: {self.prompt_throughput:.1f} tokens/s, "
                f"Avg generation throughput: {self.generation_throughput:.1f} tokens/s, "
                f"Running: {self.num_running} reqs, Waiting: {self.num_waiting} reqs, "
                f"KV cache usage: {100 * self.kv_cache_usage:.1f}%, "
                f"Prefix cache hit rate: {100 * self.prefix_cache_hit_rate:.1f}%, "
                f"Preemptions: {self.num_preemptions}")
        spec = self.spec_decoding
        if spec is not None and spec.num_drafts:
            per_pos = ", ".join(f"{n / spec.num_drafts:.2f}" for n in spec.num_accepted_tokens_per_pos)
            line += (f", Spec decode acceptance: {100 * spec.acceptance_rate:.1f}% of {spec.num_draft_tokens} "
                     f"draft tokens, mean acceptance length {spec.mean_acceptance_length:.2f}, "
                     f"per position [{per_pos}]")
        return line


class LoggingStatsLogger:
    """The periodic summary line (``--log-stats-interval``).

    Args:
        interval: seconds between summaries (> 0).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        if interval <= 0:
            raise ValueError(f"log stats interval must be > 0 seconds, got {interval}")
        self.interval = interval
        self.clock = clock
        self.last_log_time = clock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.last_scheduler: SchedulerStats | None = None
        self.logged_scheduler = SchedulerStats()  # totals at the previous summary
        self.active = False  # a step ran since the previous summary

    def on_step(self, step_stats, finished: list, iteration: IterationStats | None) -> None:
        if not self.active and self.clock() - self.last_log_time >= self.interval:
            # Idle for a whole interval: the next window starts now, so throughput is not
            # averaged over the idle time (nor over start-up).
            self.last_log_time = self.clock()
        self.active = True
        if iteration is not None:
            self.prompt_tokens += iteration.num_prompt_tokens
            self.generation_tokens += iteration.num_generation_tokens
        if step_stats is not None:
            self.last_scheduler = step_stats.scheduler
        self.maybe_log()

    def on_request_aborted(self, request_id: str) -> None:
        pass

    def on_request_rejected(self, exc: BaseException) -> None:
        pass

    def maybe_log(self) -> IntervalSummary | None:
        """Log (and return) the summary when the interval has passed and something happened."""
        now = self.clock()
        elapsed = now - self.last_log_time
        if elapsed < self.interval or self.last_scheduler is None:
            return None
        s, before = self.last_scheduler, self.logged_scheduler
        queries = s.prefix_cache_queries - before.prefix_cache_queries
        summary = IntervalSummary(
            prompt_throughput=self.prompt_tokens / elapsed,
            generation_throughput=self.generation_tokens / elapsed,
            num_running=s.num_running, num_waiting=s.num_waiting, kv_cache_usage=s.kv_cache_usage,
            prefix_cache_hit_rate=(s.prefix_cache_hits - before.prefix_cache_hits) / queries if queries else 0.0,
            num_preemptions=s.num_preemptions - before.num_preemptions,
            spec_decoding=None if s.spec_decoding is None else s.spec_decoding.minus(
                before.spec_decoding or SpecDecodingStats()),
        )
        self.last_log_time, self.logged_scheduler = now, s
        self.prompt_tokens = self.generation_tokens = 0
        self.active = False
        if not (summary.prompt_throughput or summary.generation_throughput or summary.num_preemptions
                or summary.num_running or summary.num_waiting):
            return None
        fields = dict(summary.__dict__)
        if summary.spec_decoding is not None:
            fields["spec_decoding"] = dataclasses.asdict(summary.spec_decoding)
        logger.info(summary.format(), extra={"stats": fields})
        return summary


class RequestLogger:
    """Access lines, one per finished choice, abort and rejection (``--enable-log-requests``).

    Args:
        log_prompts: also log the prompt text (``--log-prompts``); off by default because prompts
            may hold private data.
    """

    def __init__(self, log_prompts: bool = False):
        self.log_prompts = log_prompts

    def on_step(self, step_stats, finished: list, iteration: IterationStats | None) -> None:
        for state in finished:
            for stats in finished_request_stats(state):
                fields = {
                    "request_id": stats.request_id, "status": stats.finish_reason,
                    "prompt_tokens": stats.num_prompt_tokens, "generation_tokens": stats.num_generation_tokens,
                    "cached_tokens": stats.num_cached_tokens, "e2e_seconds": round(stats.e2e_latency, 6),
                    "ttft_seconds": round(stats.time_to_first_token, 6),
                }
                if state.lora_name is not None:
                    fields["lora_name"] = state.lora_name
                if self.log_prompts:
                    fields["prompt"] = state.prompt
                text = " ".join(f"{key}={value!r}" if key == "prompt" else f"{key}={value}"
                                for key, value in fields.items())
                request_logger.info("request finished: %s", text, extra={"request": fields})

    def on_request_aborted(self, request_id: str) -> None:
        fields = {"request_id": request_id, "status": "aborted"}
        request_logger.info("request aborted: request_id=%s", request_id, extra={"request": fields})

    def on_request_rejected(self, exc: BaseException) -> None:
        fields = {"status": "rejected", "reason": rejection_reason(exc), "error": str(exc)}
        request_logger.info("request rejected: reason=%s error=%s", fields["reason"], exc,
                            extra={"request": fields})
